//! DP×CP: a cluster of G GPUs as G/CP data-parallel groups of CP ranks (filled in below).
