//! Lock-free single-producer/single-consumer rings in POSIX shared memory: the wire that carries every
//! request and every token between the gateway and the worker processes.
//!
//! One process [`create`]s a named segment, the other [`attach`]es to it; each claims one role,
//! [`Producer`] or [`Consumer`] (exactly one of each at a time, across processes). Records are
//! `[len u32][kind u16][flags u16][payload]`, 8-byte aligned, never split across the wrap; the
//! producer writes straight into shared memory through a [`WriteGrant`], the consumer borrows a
//! committed record through a [`ReadGrant`]. Everything read from shared memory is checked: a bad
//! segment yields [`Error::Corrupt`], never a panic or an out-of-bounds access.
//!
//! ```
//! use std::time::Duration;
//!
//! let name = ringbuf::unique_name("doc-example");
//! let ring = ringbuf::create(&name, 64 * 1024)?; // this process unlinks it on drop
//! let mut producer = ring.producer()?;
//!
//! // Usually another process: attach by name, claim the other role.
//! let mut consumer = ringbuf::attach(&name)?.consumer()?;
//!
//! // Zero-copy: write the payload in place, then publish.
//! let mut grant = producer.reserve(5)?.expect("an empty ring has room");
//! grant.copy_from_slice(b"hello");
//! grant.set_kind(1);
//! grant.commit();
//!
//! // Many records, one Release store, at most one wake-up.
//! let mut batch = producer.batch();
//! for token in [17u32, 42, 99] {
//!     batch.try_push(&token.to_le_bytes())?;
//! }
//! batch.commit();
//!
//! let first = consumer.pop_wait(Duration::from_secs(1))?.expect("published above");
//! assert_eq!((&first[..], first.kind()), (&b"hello"[..], 1));
//! drop(first); // releases the record's bytes to the producer
//!
//! let mut tokens = Vec::new();
//! consumer.pop_batch(16, |rec| tokens.push(u32::from_le_bytes(rec.payload.try_into().unwrap())))?;
//! assert_eq!(tokens, [17, 42, 99]);
//! # Ok::<(), ringbuf::Error>(())
//! ```
//!
//! The crate's README has the segment layout, the memory-ordering argument, and what happens when
//! either side dies.

#[cfg(not(loom))]
pub mod bench;
#[cfg(not(loom))]
mod futex;

mod consumer;
mod error;
pub mod layout;
mod liveness;
mod memory;
mod producer;
mod ring;
#[cfg(not(loom))]
mod shm;
mod sync;

pub use consumer::{Consumer, ReadGrant, Record};
pub use error::{Error, Result, Role};
pub use liveness::PeerState;
pub use memory::{HeapMemory, Memory};
pub use producer::{Batch, Producer, WriteGrant};
pub use ring::{Ring, WaitConfig};
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
