//! Lock-free single-producer/single-consumer rings in POSIX shared memory: the wire that carries every
//! request and every token between the gateway and the worker processes.
