//! The `waitroom` command line. STUB until config lands.
fn main() {}
