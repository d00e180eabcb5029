//! The Redis store (single node or Cluster): every operation one Lua script.
//! STUB: being written (issue 3).
