#![doc = include_str!("../README.md")]

mod barrier;
#[cfg(not(loom))]
pub mod bench;
#[cfg(not(loom))]
pub mod futex;

mod consumer;
mod error;
pub mod layout;
mod liveness;
mod memory;
#[cfg(not(loom))]
mod private;
mod producer;
mod ring;
#[cfg(not(loom))]
mod shm;
mod sync;

pub use consumer::{Consumer, ReadGrant, Record, Records};
pub use error::{Error, Result, Role};
pub use liveness::{PeerState, process_alive};
pub use memory::{HeapMemory, Memory};
#[cfg(not(loom))]
pub use private::PrivateShm;
pub use producer::{Batch, Producer, WriteGrant};
pub use ring::{Heartbeat, Ring, SideStats, WaitConfig};
#[cfg(not(loom))]
pub use shm::{Segment, attach, create, reap, unique_name};

/// The memory a ring lives in unless said otherwise: shared memory (the heap under loom).
#[cfg(not(loom))]
#[doc(hidden)]
pub type DefaultMemory = shm::Segment;
/// The memory a ring lives in unless said otherwise: shared memory (the heap under loom).
#[cfg(loom)]
#[doc(hidden)]
pub type DefaultMemory = HeapMemory;

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
mod loom_tests;

#[cfg(all(test, not(loom)))]
mod prop_tests;
