//! The sampler's numerics, versioned.
//!
//! [`SAMPLER`] is the sampler's part of the numerics identifier a trace header records (the
//! model's parts are `nextok_model::numerics`): the arithmetic of the processed logits, the
//! candidate support, the selection distribution and the selection itself — the processors'
//! shared kernels (softmax, exponentials, sums and their order, the nucleus filter's sums,
//! candidate weights), the inverse CDF and Gumbel draws, the random streams. Each processor
//! also records its own version in every step record ([`crate::record::ProcessorRef`]).
//!
//! Any change that moves a bit of a processed logit, a logprob, a support or a selected token
//! bumps it, with the golden traces re-recorded and a line in the numerics history of
//! `docs/semantics.md`.

/// The version of the sampler's arithmetic.
pub const SAMPLER: u32 = 1;
