//! The stack against a sequential reference model of the whole stack: a plain `HashMap` from
//! `(layer, key)` to `(plan, words)`, every layer decided in turn with the algorithms' pure
//! transitions, and the words written only if every layer admits (always, for a record of
//! usage). Random sequences of checks (mixed plans, costs, skipped layers), records, peeks,
//! refunds, reclaims and clock steps must give the same decisions, the same errors and the
//! same refunds; with a layer on the user layer's key (`Layer::same_key`, one entry for both
//! in the stack, two states in the model) too, and for stacks on the fixed-plan path (every
//! layer one plan and no plan function, or plans of several limits chosen per call) on one key
//! and on several. Every built-in algorithm takes part, a calendar quota (through the stack's
//! boxed algorithms) among them, its windows ending mid-run: what a layer's kept answer
//! (`Stack::check_each`) says is checked against the model's eager decision of that layer.

use std::collections::HashMap;
use std::time::Duration;

use limiter_calendar::{Calendar, CalendarCounter, CalendarUnit};
use limiter_core::{Algorithm, Clock, Decision, DecisionError, Limit, ManualClock, Step, Usage};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_stack::Kind;
use limiter_stack::{CallError, Grant, Layer, LayerAnswers, Plan, Stack, StackDecision};
use limiter_testkit::harness::proptest_config;
use limiter_token_bucket::Gcra;
use proptest::prelude::*;

#[path = "model/fixed_plans.rs"]
mod fixed_plans;
use fixed_plans::{
    one_key_chosen_plans_specs, one_key_several_limits_specs, one_key_specs, several_keys_specs,
};

#[derive(Clone, Copy, Debug)]
struct Request {
    user: u64,
    pro: bool,
    write: bool,
}

/// The algorithms, by value, for the model.
#[derive(Clone, Debug)]
enum Alg {
    Bucket(Gcra),
    Sliding(SlidingCounter),
    Fixed(FixedCounter),
    Calendar(CalendarCounter),
}

macro_rules! each {
    ($self:expr, $a:ident => $body:expr) => {
        match $self {
            Alg::Bucket($a) => $body,
            Alg::Sliding($a) => $body,
            Alg::Fixed($a) => $body,
            Alg::Calendar($a) => $body,
        }
    };
}

impl Alg {
    fn fresh(&self) -> u64 {
        match self {
            Alg::Bucket(_) => Gcra::FRESH,
            Alg::Sliding(_) => SlidingCounter::FRESH,
            Alg::Fixed(_) => FixedCounter::FRESH,
            Alg::Calendar(_) => CalendarCounter::FRESH,
        }
    }
    fn decide(&self, w: u64, cost: u64, now: u64) -> Result<Step, DecisionError> {
        each!(self, a => a.decide(w, cost, now))
    }
    fn record(&self, w: u64, cost: u64, now: u64) -> Result<Step, DecisionError> {
        each!(self, a => a.record(w, cost, now))
    }
    fn usage(&self, w: u64, now: u64) -> Usage {
        each!(self, a => a.usage(w, now))
    }
    fn with_usage(&self, u: Usage, now: u64) -> Result<u64, DecisionError> {
        each!(self, a => a.with_usage(u, now))
    }
    fn refund(&self, w: u64, units: u64, at: u64, now: u64) -> Option<u64> {
        each!(self, a => a.refund(w, units, at, now))
    }
}

fn limit(count: u64, ms: u64) -> Limit {
    Limit::new(count, Duration::from_millis(ms))
}

/// Unix time at the model's clock reading 0: 20 s before 2028 begins in UTC, so a run's clock
/// steps (up to a second each) cross a day's, a month's and a year's end mid-run.
const ORIGIN_UNIX_NS: u64 = (1_830_297_600 - 20) * 1_000_000_000;

/// `count` a UTC `unit` (its window ends 20 s into a run).
fn calendar(count: u64, unit: CalendarUnit) -> Alg {
    let calendar = Calendar::new(unit, "UTC").unwrap();
    Alg::Calendar(CalendarCounter::new(count, calendar, ORIGIN_UNIX_NS).unwrap())
}

/// The layers, as (name, keyer, plans), shared by the stack and the model.
struct Spec {
    name: &'static str,
    /// The earlier layer whose keyer this one shares (`Layer::same_key`).
    shares: Option<usize>,
    key: fn(&Request) -> Option<u64>,
    choose: fn(&Request) -> usize,
    plans: Vec<Vec<Alg>>,
}

/// The layers (four, some with a plan function: the fixed-plan path's arms for plan
/// functions); with `one_limit_each`, the user layer keeps only its first limit, so every plan
/// has one limit; with `grouped`, a last layer on the user layer's key, with two plans of its
/// own (five layers: with `one_limit_each`, the lean path where it can).
fn specs(one_limit_each: bool, grouped: bool) -> Vec<Spec> {
    let mut user = vec![
        Alg::Bucket(Gcra::new(limit(3, 1_000)).unwrap()),
        Alg::Sliding(SlidingCounter::new(limit(5, 2_000)).unwrap()),
    ];
    if one_limit_each {
        user.truncate(1);
    }
    let mut specs = vec![
        Spec {
            name: "user",
            shares: None,
            key: |r| Some(r.user),
            choose: |_| 0,
            plans: vec![user],
        },
        Spec {
            name: "writes",
            shares: None,
            key: |r| r.write.then_some(r.user),
            choose: |r| usize::from(r.pro),
            plans: vec![
                vec![Alg::Bucket(Gcra::new(limit(2, 1_000)).unwrap())],
                vec![Alg::Sliding(SlidingCounter::new(limit(4, 1_000)).unwrap())],
            ],
        },
        Spec {
            name: "pair",
            shares: None,
            key: |r| Some(r.user % 2),
            choose: |_| 0,
            plans: vec![vec![Alg::Fixed(
                FixedCounter::new(limit(4, 1_000)).unwrap(),
            )]],
        },
        Spec {
            name: "global",
            shares: None,
            key: |_| None, // global: see `build`
            choose: |_| 0,
            plans: vec![vec![Alg::Bucket(
                Gcra::new(limit(6, 1_000).with_burst(4)).unwrap(),
            )]],
        },
    ];
    if grouped {
        specs.push(Spec {
            name: "user-minute",
            shares: Some(0),
            key: |r| Some(r.user),
            choose: |r| usize::from(r.pro),
            plans: vec![
                vec![Alg::Bucket(Gcra::new(limit(4, 1_500)).unwrap())],
                vec![calendar(9, CalendarUnit::Month)],
            ],
        });
    }
    specs
}

fn add(plan: Plan, alg: &Alg) -> Plan {
    match alg {
        Alg::Bucket(a) => plan.limit(Kind::TokenBucket, *a.limit()),
        Alg::Sliding(a) => plan.limit(Kind::SlidingWindow, *a.limit()),
        Alg::Fixed(a) => plan.limit(Kind::FixedWindow, *a.limit()),
        Alg::Calendar(a) => plan.algorithm(a.clone()),
    }
}

fn build(clock: &ManualClock, specs: Vec<Spec>) -> Stack<Request, u64, ManualClock> {
    let mut layers: Vec<Layer<Request, u64>> = Vec::new();
    for spec in specs {
        let plans: Vec<Plan> = spec
            .plans
            .iter()
            .enumerate()
            .map(|(i, algs)| algs.iter().fold(Plan::new(format!("{i}")), add))
            .collect();
        let layer = match spec.shares {
            _ if spec.name == "global" => Layer::global(spec.name),
            Some(lead) => layers[lead].same_key(spec.name),
            None => Layer::keyed(spec.name, spec.key),
        };
        // A layer of one plan is built without a plan function, as users build it (a stack
        // of such layers on one key takes the one-key path).
        layers.push(match &spec.plans[..] {
            [only] => only.iter().fold(layer, |layer, alg| match alg {
                Alg::Bucket(a) => layer.limit(Kind::TokenBucket, *a.limit()),
                Alg::Sliding(a) => layer.limit(Kind::SlidingWindow, *a.limit()),
                Alg::Fixed(a) => layer.limit(Kind::FixedWindow, *a.limit()),
                Alg::Calendar(a) => layer.algorithm(a.clone()),
            }),
            _ => layer.plans(plans, spec.choose),
        });
    }
    Stack::builder()
        .clock(clock.clone())
        .shards(1)
        .layers(layers)
        .build()
        .unwrap()
}

/// One layer's expected part: (layer, plan, binding limit, decision).
type Part = (usize, usize, usize, Decision);

struct Model {
    specs: Vec<Spec>,
    states: HashMap<(usize, Option<u64>), (usize, Vec<u64>)>,
}

fn binds_over(a: &Decision, b: &Decision) -> bool {
    match (a.is_denied(), b.is_denied()) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => a.retry_after_nanos() > b.retry_after_nanos(),
        (false, false) => a.remaining() < b.remaining(),
    }
}

fn combine(parts: &[Decision], limit: u64) -> Decision {
    let allowed = parts.iter().all(Decision::is_allowed);
    let remaining = parts
        .iter()
        .map(Decision::remaining)
        .min()
        .unwrap_or(u64::MAX);
    let retry = parts
        .iter()
        .map(Decision::retry_after_nanos)
        .max()
        .unwrap_or(0);
    let reset = parts
        .iter()
        .map(Decision::reset_after_nanos)
        .max()
        .unwrap_or(0);
    if allowed {
        Decision::allow(limit, remaining, reset)
    } else {
        Decision::deny(limit, remaining, retry.max(1), reset)
    }
}

impl Model {
    fn key(&self, layer: usize, r: &Request) -> Option<Option<u64>> {
        if self.specs[layer].name == "global" {
            Some(None)
        } else {
            (self.specs[layer].key)(r).map(Some)
        }
    }

    fn check(
        &mut self,
        r: &Request,
        cost: u64,
        now: u64,
        record: bool,
    ) -> Result<Vec<Part>, CallError> {
        let mut parts = Vec::new();
        let mut writes = Vec::new();
        for (layer, spec) in self.specs.iter().enumerate() {
            let Some(key) = self.key(layer, r) else {
                continue;
            };
            let plan = (spec.choose)(r);
            let algs = &spec.plans[plan];
            let err = |j: usize| {
                move |source| CallError::Decision {
                    layer: spec.name.into(),
                    limit_index: j,
                    source,
                }
            };
            let (old_plan, mut words) = self
                .states
                .get(&(layer, key))
                .cloned()
                .unwrap_or_else(|| (plan, algs.iter().map(Alg::fresh).collect()));
            if old_plan != plan {
                for (j, w) in words.iter_mut().enumerate() {
                    let used = spec.plans[old_plan][j].usage(*w, now);
                    *w = algs[j].with_usage(used, now).map_err(err(j))?;
                }
            }
            let mut decisions = Vec::new();
            for (j, a) in algs.iter().enumerate() {
                let step = if record {
                    a.record(words[j], cost, now)
                } else {
                    a.decide(words[j], cost, now)
                }
                .map_err(err(j))?;
                if let Some(n) = step.next {
                    words[j] = n;
                }
                decisions.push(step.decision);
            }
            let mut binding = 0;
            for j in 1..decisions.len() {
                if binds_over(&decisions[j], &decisions[binding]) {
                    binding = j;
                }
            }
            parts.push((
                layer,
                plan,
                binding,
                combine(&decisions, decisions[binding].limit()),
            ));
            writes.push(((layer, key), (plan, words)));
        }
        if cost > 0 && (record || parts.iter().all(|p| p.3.is_allowed())) {
            self.states.extend(writes);
        }
        Ok(parts)
    }

    fn refund(&mut self, r: &Request, units: u64, at: u64, now: u64) {
        for layer in 0..self.specs.len() {
            let Some(key) = self.key(layer, r) else {
                continue;
            };
            if let Some((plan, words)) = self.states.get_mut(&(layer, key)) {
                for (j, w) in words.iter_mut().enumerate() {
                    if let Some(back) = self.specs[layer].plans[*plan][j].refund(*w, units, at, now)
                    {
                        *w = back;
                    }
                }
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Check {
        user: u64,
        pro: bool,
        write: bool,
        cost: u64,
        record: bool,
        /// Whether each layer's answer is asked for too ([`Stack::check_each`]).
        detailed: bool,
    },
    Refund {
        grant: usize,
        units: u64,
    },
    Advance(u64),
    Reclaim,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..4u64, any::<bool>(), any::<bool>(), prop_oneof![4 => Just(1u64), 1 => 0..4u64], any::<bool>())
            .prop_map(|(user, pro, write, cost, detailed)| Op::Check { user, pro, write, cost, record: false, detailed }),
        2 => (0..4u64, any::<bool>(), any::<bool>(), prop_oneof![2 => Just(1u64), 1 => 0..12u64])
            .prop_map(|(user, pro, write, cost)| Op::Check { user, pro, write, cost, record: true, detailed: false }),
        1 => (0..8usize, 0..3u64).prop_map(|(grant, units)| Op::Refund { grant, units }),
        2 => prop_oneof![0..400_000_000u64, Just(1_000_000_000)].prop_map(Op::Advance),
        1 => Just(Op::Reclaim),
    ]
}

/// The compact answer `got` says what the model's layers (`parts`) say together: allowed iff
/// every layer is, bound by the layer the stack's rule names, the least left, the longest waits.
fn assert_compact_answer(
    parts: &[Part],
    got: &StackDecision,
    op: usize,
) -> Result<(), TestCaseError> {
    let allowed = parts.iter().all(|p| p.3.is_allowed());
    prop_assert_eq!(got.is_allowed(), allowed, "op {}", op);
    let mut binding = 0;
    for j in 1..parts.len() {
        if binds_over(&parts[j].3, &parts[binding].3) {
            binding = j;
        }
    }
    let bound = parts.get(binding);
    prop_assert_eq!(
        got.binding()
            .map(|b| (b.layer, b.plan, b.limit_index, b.decision)),
        bound.copied(),
        "op {}",
        op
    );
    let Some(bound) = bound else {
        prop_assert_eq!(got.decision(), Decision::allow(u64::MAX, u64::MAX, 0));
        return Ok(());
    };
    let least = parts
        .iter()
        .map(|p| p.3.remaining())
        .min()
        .unwrap_or(u64::MAX);
    let longest_reset = parts
        .iter()
        .map(|p| p.3.reset_after_nanos())
        .max()
        .unwrap_or(0);
    let longest_wait = parts
        .iter()
        .map(|p| p.3.retry_after_nanos())
        .max()
        .unwrap_or(0);
    let want = if allowed {
        Decision::allow(bound.3.limit(), least, longest_reset)
    } else {
        Decision::deny(bound.3.limit(), least, longest_wait.max(1), longest_reset)
    };
    prop_assert_eq!(got.decision(), want, "op {}", op);
    Ok(())
}

fn run(ops: &[Op], one_limit_each: bool, grouped: bool) -> Result<(), TestCaseError> {
    run_specs(ops, || specs(one_limit_each, grouped))
}

fn run_specs(ops: &[Op], specs: impl Fn() -> Vec<Spec>) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let stack = build(&clock, specs());
    let mut model = Model {
        specs: specs(),
        states: HashMap::new(),
    };
    let mut grants: Vec<(Request, Grant, u64)> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let now = clock.now();
        match *op {
            Op::Check {
                user,
                pro,
                write,
                cost,
                record,
                detailed,
            } => {
                let r = Request { user, pro, write };
                let want = model.check(&r, cost, now, record);
                let mut each = LayerAnswers::new();
                let got = if record {
                    stack.record(&r, cost).map(|d| (d, None))
                } else if detailed {
                    stack.check_each(&r, cost, &mut each).map(|d| (d, None))
                } else {
                    stack.acquire(&r, cost)
                };
                match (want, got) {
                    (Err(w), Err(g)) => prop_assert_eq!(w, g, "op {}", i),
                    (Ok(parts), Ok((d, grant))) => {
                        if detailed {
                            let got: Vec<Part> = each
                                .iter()
                                .map(|l| (l.layer, l.plan, l.limit_index, l.decision))
                                .collect();
                            prop_assert_eq!(&parts, &got, "op {}: {:?}", i, op);
                            prop_assert_eq!(each.summary(), d);
                        }
                        assert_compact_answer(&parts, &d, i)?;
                        if let Some(grant) = grant {
                            grants.push((r, grant, now));
                        }
                    }
                    (w, g) => prop_assert!(false, "op {}: model {:?}, stack {:?}", i, w, g),
                }
            }
            Op::Refund { grant, units } => {
                if let Some((r, g, at)) = grants.get_mut(grant) {
                    let ok = units <= g.left();
                    prop_assert_eq!(stack.refund(r, g, units).is_ok(), ok);
                    if ok && units > 0 {
                        model.refund(r, units, *at, now);
                    }
                }
            }
            Op::Advance(ns) => clock.advance_nanos(ns),
            Op::Reclaim => {
                stack.reclaim_full();
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(proptest_config(512))]
    #[test]
    fn the_stack_decides_like_the_sequential_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(&ops, false, false)?;
    }

    #[test]
    fn a_stack_with_layers_on_one_key_decides_like_the_sequential_model(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(&ops, false, true)?;
    }

    #[test]
    fn a_stack_on_the_one_key_path_decides_like_the_sequential_model(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run_specs(&ops, one_key_specs)?;
    }

    #[test]
    fn a_stack_on_the_one_key_path_with_several_limits_a_layer_decides_like_the_model(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run_specs(&ops, one_key_several_limits_specs)?;
    }

    #[test]
    fn a_stack_on_the_one_key_path_with_a_plan_function_decides_like_the_model(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run_specs(&ops, one_key_chosen_plans_specs)?;
    }

    #[test]
    fn a_stack_on_the_fixed_plan_path_on_several_keys_decides_like_the_model(
        ops in proptest::collection::vec(op(), 1..120),
        global in any::<bool>(),
        several_limits in any::<bool>(),
    ) {
        run_specs(&ops, || several_keys_specs(global, several_limits))?;
    }

    #[test]
    fn a_stack_of_one_limit_layers_on_one_key_decides_like_the_sequential_model(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(&ops, true, true)?;
    }

    #[test]
    fn a_stack_of_one_limit_layers_decides_like_the_sequential_model(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(&ops, true, false)?;
    }
}
