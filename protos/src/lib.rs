//! Wire types: the gRPC `ringserve.v1` API (tonic/prost) and the fixed-layout shared-memory records
//! (`Submit`, `Cancel`, `Tokens`, `StepPlan`) exchanged between gateway and workers over the rings.
