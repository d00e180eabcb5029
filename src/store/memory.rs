//! The embedded, single-instance store: every operation one critical section.
//! STUB: being written.
