//! Incremental construction of a [`Plan`], shared by every planner so that none of them repeats
//! the bookkeeping (empty-task filtering, step padding, parameter recording).

use std::collections::BTreeMap;

use super::{
    allowed_pairs, Document, HeadRange, Mask, Plan, RankPlan, SchemeInfo, Step, Task, TokenRange,
    Transfer,
};
use crate::planners::PlanContext;
use crate::trace::Batch;

/// Builds a plan rank by rank. Tasks with no pair allowed by the mask are dropped, so planners
/// can emit the cross product of what they hold and let the mask decide.
#[derive(Debug, Clone)]
pub struct PlanBuilder {
    plan: Plan,
    /// Tasks kept so far (for planners that bound their plan's size).
    tasks: u64,
}

impl PlanBuilder {
    /// Start a plan for `batch` under `ctx`, produced by scheme `name` with `params`.
    pub fn new(
        name: &str,
        params: BTreeMap<String, serde_json::Value>,
        batch: &Batch,
        ctx: &PlanContext<'_>,
    ) -> Self {
        let documents = batch
            .doc_lens
            .iter()
            .enumerate()
            .map(|(i, &len)| Document {
                id: i as u32,
                len,
                pad: 0,
            })
            .collect();
        let ranks = (0..ctx.ranks)
            .map(|rank| RankPlan {
                rank,
                owned: Vec::new(),
                steps: Vec::new(),
                pad_slots: 0,
            })
            .collect();
        PlanBuilder {
            plan: Plan {
                version: 1,
                scheme: SchemeInfo {
                    name: name.to_string(),
                    params,
                },
                num_ranks: ctx.ranks,
                mask: ctx.mask,
                q_heads: ctx.model.q_heads,
                kv_heads: ctx.model.kv_heads,
                memory_cap_tokens: None,
                congestion_free: false,
                batch_index: Some(batch.index as u64),
                model: Some(ctx.model.name.clone()),
                hardware: Some(ctx.hardware.name.clone()),
                hardware_file: None,
                model_file: None,
                tp: (ctx.model.tp > 1).then_some(ctx.model.tp),
                documents,
                input_layout: None,
                ranks,
                transfers: Vec::new(),
            },
            tasks: 0,
        }
    }

    /// The transfers kept so far.
    pub fn transfers(&self) -> &[Transfer] {
        &self.plan.transfers
    }

    /// Tasks kept so far.
    pub fn task_count(&self) -> u64 {
        self.tasks
    }

    /// The mask of the plan being built.
    pub fn mask(&self) -> Mask {
        self.plan.mask
    }

    /// Documents of the plan being built.
    pub fn documents(&self) -> &[Document] {
        &self.plan.documents
    }

    /// Record a parameter the scheme decided for this batch (e.g. the sharding WLB-LLM's
    /// selector chose, or padding the authors' implementation would add), so the plan says how
    /// it was made.
    pub fn param(&mut self, key: &str, value: serde_json::Value) -> &mut Self {
        self.plan.scheme.params.insert(key.to_string(), value);
        self
    }

    /// Record that the batch was planned with `pads[i]` padding tokens appended to document
    /// `i` (see `planners::shard::pad_batch`): documents keep their real length and carry the
    /// padding separately, and `scheme.params.pad_tokens` states the total.
    pub fn mark_padding(&mut self, pads: &[u64]) -> &mut Self {
        for (d, &p) in self.plan.documents.iter_mut().zip(pads) {
            d.len -= p.min(d.len.saturating_sub(1));
            d.pad = p;
        }
        let total: u64 = pads.iter().sum();
        self.plan
            .scheme
            .params
            .insert("pad_tokens".to_string(), serde_json::json!(total));
        self
    }

    /// Give `rank` `tokens` slots of masked padding (memory, no attention).
    pub fn pad_slots(&mut self, rank: u32, tokens: u64) -> &mut Self {
        self.plan.ranks[rank as usize].pad_slots += tokens;
        self
    }

    /// Declare a per-rank token cap the verifier must hold the plan to.
    pub fn memory_cap(&mut self, tokens: u64) -> &mut Self {
        self.plan.memory_cap_tokens = Some(tokens);
        self
    }

    /// Declare that transfers form congestion-free rounds.
    pub fn congestion_free(&mut self, yes: bool) -> &mut Self {
        self.plan.congestion_free = yes;
        self
    }

    /// Declare the user's layout the plan starts from and returns outputs to (one list of
    /// ranges per rank; see [`Plan::input_layout`]).
    pub fn input_layout(&mut self, layout: Vec<Vec<TokenRange>>) -> &mut Self {
        self.plan.input_layout = Some(layout);
        self
    }

    /// Give `range` to `rank` (appended to its buffer). Empty ranges are ignored.
    pub fn own(&mut self, rank: u32, range: TokenRange) -> &mut Self {
        if !range.is_empty() {
            self.plan.ranks[rank as usize].owned.push(range);
        }
        self
    }

    /// Add a task on `rank` in `step` unless the mask allows no pair in it. Returns whether the
    /// task was kept.
    pub fn task(&mut self, rank: u32, step: u32, q: TokenRange, kv: TokenRange) -> bool {
        self.task_heads(rank, step, q, kv, None)
    }

    /// [`PlanBuilder::task`] restricted to query heads `heads` (absent = all), for head-parallel
    /// schemes (Ulysses) and head-sliced pipelines (ring-flash-attention's llama3 varlen).
    pub fn task_heads(
        &mut self,
        rank: u32,
        step: u32,
        q: TokenRange,
        kv: TokenRange,
        heads: Option<HeadRange>,
    ) -> bool {
        if q.doc != kv.doc || allowed_pairs(self.plan.mask, q.start, q.end, kv.start, kv.end) == 0 {
            return false;
        }
        let steps = &mut self.plan.ranks[rank as usize].steps;
        if steps.len() <= step as usize {
            steps.resize(step as usize + 1, Step::default());
        }
        steps[step as usize].tasks.push(Task { q, kv, heads });
        self.tasks += 1;
        true
    }

    /// Add a transfer unless it moves nothing.
    pub fn transfer(&mut self, t: Transfer) -> &mut Self {
        if t.tokens() > 0 {
            self.plan.transfers.push(t);
        }
        self
    }

    /// Finish: every rank gets the same number of steps (trailing empty steps are padding the
    /// executor skips), so step indices line up across ranks; the plan says the oldest format
    /// version that holds it.
    pub fn finish(mut self) -> Plan {
        let steps = self
            .plan
            .ranks
            .iter()
            .map(|r| r.steps.len())
            .max()
            .unwrap_or(0);
        for r in &mut self.plan.ranks {
            r.steps.resize(steps, Step::default());
        }
        self.plan.version = self.plan.required_version();
        self.plan
    }
}
