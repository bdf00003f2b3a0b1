//! Clients nobody here wrote.
