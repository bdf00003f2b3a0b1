//! SIGKILL under concurrent SETs.
