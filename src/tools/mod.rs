//! What frigg measures and checks besides serving: benchmarks, the load generator, task
//! accuracy, parity with the reference, and file inspection.

pub mod bench;
pub mod eval;
pub mod inspect;
pub mod loadgen;
pub mod parity;
