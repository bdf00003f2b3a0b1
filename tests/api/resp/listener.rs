//! The listener.
