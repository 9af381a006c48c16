//! An in-process [`Decider`] for the service's tests: each configured limit a stack of one
//! layer keyed by the descriptor's identifier, each ad-hoc shape a stack of its own, every
//! request's items all or nothing through the workspace's seam, on one `ManualClock`; the
//! statistics kept in a map the tests read.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use limiter_core::{Limit, ManualClock};
use limiter_envoy::service::{EnvoyError, Options, Request, Response};
use limiter_envoy::{
    AddLimitError, Answer, Decider, Domains, Envoy, Item, LimitSpec, RuleStats, Target,
};
use limiter_stack::{BatchItem, Kind, Layer, Outcome, Stack, decide_all};

type Counter = Stack<String, String, ManualClock>;

/// Every statistic the service reported, by descriptor key and name.
pub(crate) type Stats = Arc<Mutex<BTreeMap<(String, String), u64>>>;

/// One descriptor path's statistics, kept in the shared map.
#[derive(Clone, Debug)]
pub(crate) struct Rule {
    key: String,
    stats: Stats,
}

impl RuleStats for Rule {
    fn add(&self, stat: &str, n: u64) {
        let mut stats = self.stats.lock().expect("not poisoned");
        *stats
            .entry((self.key.clone(), stat.to_owned()))
            .or_default() += n;
    }
}

/// The decider: configured limits by index, ad-hoc shapes made on first use.
pub(crate) struct InProcess {
    clock: ManualClock,
    limits: Vec<Counter>,
    ad_hoc: Mutex<BTreeMap<(String, u64, u64), Arc<Counter>>>,
    stats: Stats,
}

fn counter(
    kind: Kind,
    limit: Limit,
    clock: &ManualClock,
) -> Result<Counter, limiter_stack::BuildError> {
    Stack::builder()
        .layer(Layer::keyed("descriptor", |id: &String| Some(id.clone())).limit(kind, limit))
        .clock(clock.clone())
        .build()
}

impl InProcess {
    fn new(clock: ManualClock) -> Self {
        Self {
            clock,
            limits: Vec::new(),
            ad_hoc: Mutex::new(BTreeMap::new()),
            stats: Stats::default(),
        }
    }

    /// The counter of an ad-hoc item's shape (made on first use) and the key it is counted
    /// under (its namespace and identifier); `None` for a configured limit's item.
    fn ad_hoc(&self, item: &Item<usize>) -> Result<Option<(Arc<Counter>, String)>, EnvoyError> {
        let Target::AdHoc {
            kind,
            limit,
            duration_ms,
            namespace,
        } = &item.target
        else {
            return Ok(None);
        };
        let mut shapes = self.ad_hoc.lock().expect("not poisoned");
        let shape = (kind.to_string(), *limit, *duration_ms);
        let stack = match shapes.get(&shape) {
            Some(stack) => Arc::clone(stack),
            None => {
                let each = Limit::new(*limit, Duration::from_millis(*duration_ms));
                let made = counter(*kind, each, &self.clock)
                    .map_err(|e| EnvoyError::Invalid(e.to_string()))?;
                Arc::clone(shapes.entry(shape).or_insert(Arc::new(made)))
            }
        };
        Ok(Some((stack, format!("{namespace}/{}", item.identifier))))
    }
}

impl Decider for InProcess {
    type Limit = usize;
    type Stats = Rule;

    fn add_limit(&mut self, _: &str, _: &str, spec: &LimitSpec) -> Result<usize, AddLimitError> {
        let stack = counter(spec.kind, spec.limit, &self.clock)
            .map_err(|e| AddLimitError::Refused(Box::new(e)))?;
        self.limits.push(stack);
        Ok(self.limits.len() - 1)
    }

    async fn decide(&self, items: &[Item<usize>]) -> Result<(bool, Vec<Answer>), EnvoyError> {
        // Ad-hoc counters first (they may be made now), then every item borrowed at once.
        let mut ad_hoc = Vec::new();
        for item in items {
            ad_hoc.extend(self.ad_hoc(item)?);
        }
        let mut ad_hoc_iter = ad_hoc.iter();
        let mut batch = Vec::with_capacity(items.len());
        for item in items {
            let (limiter, request): (&Counter, &String) = match item.target {
                Target::Limit(i) => (
                    self.limits
                        .get(i)
                        .ok_or_else(|| EnvoyError::Invalid(format!("no configured limit {i}")))?,
                    &item.identifier,
                ),
                Target::AdHoc { .. } => {
                    let (stack, key) = ad_hoc_iter.next().expect("one per ad-hoc item");
                    (&**stack, key)
                }
            };
            batch.push(BatchItem {
                limiter,
                request,
                cost: item.cost,
                charge: item.charge,
                shadow: item.shadow,
            });
        }
        let decided = decide_all(&batch, None)
            .await
            .map_err(|e| EnvoyError::Invalid(e.to_string()))?;
        let answers = decided.outcomes.into_iter().map(|outcome| match outcome {
            Outcome::Decided { decision, .. } => Ok(Answer {
                decision: decision.decision(),
            }),
            _ => Err(EnvoyError::Unavailable("an in-process stack failed".into())),
        });
        Ok((decided.admitted, answers.collect::<Result<_, _>>()?))
    }

    fn rule_stats(&self, full_key: &str) -> Rule {
        Rule {
            key: full_key.to_owned(),
            stats: Arc::clone(&self.stats),
        }
    }

    fn stat(&self, key: &str, stat: &'static str, n: u64) {
        self.rule_stats(key).add(stat, n);
    }
}

/// The service on `file` (domain `web`), deciding on an in-process decider on a manual clock.
pub(crate) struct Fixture {
    pub(crate) envoy: Envoy<usize, Rule>,
    pub(crate) decider: InProcess,
    pub(crate) clock: ManualClock,
}

impl Fixture {
    pub(crate) fn new(file: &str, options: Options) -> Self {
        let clock = ManualClock::new();
        let mut decider = InProcess::new(clock.clone());
        let domains = Domains::load([("web.yaml", file)]).expect("valid");
        let envoy = Envoy::attach(domains, &mut decider)
            .expect("attaches")
            .with_options(options);
        Self {
            envoy,
            decider,
            clock,
        }
    }

    /// `request` decided: in process, the answer is ready when first polled.
    pub(crate) fn answer(&self, request: &Request) -> Result<Response, EnvoyError> {
        let future = self.envoy.decide(&self.decider, request);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::pin!(future).poll(&mut cx) {
            std::task::Poll::Ready(answer) => answer,
            std::task::Poll::Pending => panic!("an in-process decider answers at once"),
        }
    }

    /// The statistic `stat` of descriptor key `key` (0 if never reported).
    pub(crate) fn stat(&self, key: &str, stat: &str) -> u64 {
        let stats = self.decider.stats.lock().expect("not poisoned");
        stats
            .get(&(key.to_owned(), stat.to_owned()))
            .copied()
            .unwrap_or(0)
    }
}
