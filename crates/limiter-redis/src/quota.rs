//! [`RedisQuota`]: at most `count` units per calendar window (a day, a week from Monday, a
//! month or a year in a time zone) per key, shared by a fleet. The windows are the
//! [`Calendar`]'s, the same boundaries as in process; which window a call falls in is decided by
//! Redis's clock: the caller sends the window its own clock is in and the next one, and the
//! script counts in whichever holds Redis's `TIME`, so nodes whose clocks drift apart around
//! a boundary still count in one window. One key per key (the window's number and its count),
//! expiring when the window ends; one script call per decision.

use limiter_calendar::{Calendar, MAX_CALENDAR_COUNT, Window};
use limiter_core::{Decision, Usage};
use redis::Value;

use crate::backend::RedisBackend;
use crate::error::{BackendError, BuildError};
use crate::stack::DEFAULT_PREFIX;
use crate::stack::build::check_name;

/// Lua's `read(key)`: a quota's counter at `key` as `held, index, used, count, calendar`
/// (`held` false for no key; `count` and `calendar` nil for a counter written before they were
/// kept), or `nil` and an error reply for a value no quota wrote (another type, or a string
/// of another shape: an operator's or another program's key under the quota's prefix), which
/// is refused and left as found, as a rate limit's script refuses a state it cannot read.
macro_rules! reading {
    () => {
        "local function read(key) \
  local held = redis.pcall('GET', key) \
  if type(held) == 'table' then \
    return nil, redis.error_reply('limiter: key ' .. key .. ' cannot be read (' .. tostring(held.err) .. '); delete it or change the prefix') \
  end \
  if not held then return false end \
  local i, c, rest = string.match(held, '^(%d+):(%d+)(.*)$') \
  local n, cal = string.match(rest or '', '^:(%d+):(.+)$') \
  if i == nil or (rest ~= '' and cal == nil) or (n ~= nil and tonumber(n) < 1) then \
    return nil, redis.error_reply('limiter: key ' .. key .. ' holds \"' .. string.sub(held, 1, 40) .. '\", not a quota counter; delete it or change the prefix') \
  end \
  return true, i, c, n, cal \
end "
    };
}

/// Picks the window holding `now` (the caller's, or the next), then counts in it: a take only
/// within the count, a record whatever it holds, up to `cap`. `ARGV = [now?, cost, count,
/// index, end_ms, next_index, next_end_ms, record, cap, calendar]`: `{admitted, used, ms to
/// the window's end, the window's number}` (a record is admitted when the window is still
/// within its count).
///
/// A key's counter is `index:used:count:calendar` (the window's number, the units counted in
/// it, and the count and calendar that counted them; `index:used` alone in keys written before
/// those were kept). A counter written under another count or calendar keeps its consumption:
/// the same fraction of the count, rounded up, as a changed limit keeps it in process; under
/// another calendar its window is still on (the key lives until that window ends), so it counts
/// in the window the current calendar is in. `scaled` is exact while `used * new` is below
/// 2^53 (Lua's numbers are doubles), and above it rounds up by at most one unit more.
const TAKE: &str = concat!(
    reading!(),
    "local function scaled(used, old, new) \
  if old == new then return used end \
  local p, q = used * new, 0 \
  if p < 9007199254740992 then \
    q = math.floor(p / old) \
    local r = p - q * old \
    if r < 0 then q = q - 1 elseif r >= old then q = q + 1 end \
    if q * old < p then q = q + 1 end \
  else q = math.ceil(used / old * new) + 1 end \
  return math.min(q, 2 * new) \
end \
local index, finish = ARGV[4], tonumber(ARGV[5]) \
if now >= finish then index, finish = ARGV[6], tonumber(ARGV[7]) end \
local cost, count = tonumber(ARGV[2]), tonumber(ARGV[3]) \
local used = 0 \
local held, i, c, n, cal = read(KEYS[1]) \
if held == nil then return i end \
if held then \
  if cal ~= nil and cal ~= ARGV[10] then used = scaled(tonumber(c), tonumber(n), count) \
  elseif i == index then \
    used = tonumber(c) \
    if n ~= nil then used = scaled(used, tonumber(n), count) end \
  end \
end \
local left = math.max(1, finish - now) \
local within = used + cost <= count \
if within or ARGV[8] == '1' then \
  local after = math.min(used + cost, tonumber(ARGV[9])) \
  if cost > 0 then \
    redis.call('SET', KEYS[1], index .. ':' .. after .. ':' .. ARGV[3] .. ':' .. ARGV[10], 'PX', left) \
  end \
  return {within and 1 or 0, after, left, tonumber(index)} \
end \
return {0, used, left, tonumber(index)}"
);

/// Gives `units` back to window `index` if the key still counts in it. `ARGV = [units, index]`:
/// the units left counted (the count and calendar that counted them kept).
const REFUND: &str = concat!(
    reading!(),
    "local held, i, c, n, cal = read(KEYS[1]) \
if held == nil then return i end \
if not held or i ~= ARGV[2] then return 0 end \
local used = math.max(0, tonumber(c) - tonumber(ARGV[1])) \
local rest = '' if cal ~= nil then rest = ':' .. n .. ':' .. cal end \
redis.call('SET', KEYS[1], i .. ':' .. used .. rest, 'KEEPTTL') \
return used"
);

/// Calendar quotas per key on Redis (see the module docs).
#[derive(Clone, Debug)]
pub struct RedisQuota {
    backend: RedisBackend,
    prefix: String,
    name: String,
    count: u64,
    calendar: Calendar,
}

/// What a quota answered: the decision, and the window it was counted in (to refund it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaAnswer {
    /// Admitted (the units counted) or denied (nothing counted); `reset_after` and a denial's
    /// `retry_after` are the time to the window's end.
    pub decision: Decision,
    /// The window's number.
    pub window: u64,
}

impl RedisBackend {
    /// A quota named `name` (part of each key's Redis key, `limiter:quota:<name>:{<key>}`;
    /// [`with_prefix`](RedisQuota::with_prefix) changes the first part): at most `count` units
    /// per window of `calendar` per key (1 to [`MAX_CALENDAR_COUNT`]). A name that is empty or
    /// holds `{` or `}` is refused.
    pub fn quota(
        &self,
        name: &str,
        count: u64,
        calendar: Calendar,
    ) -> Result<RedisQuota, BuildError> {
        check_name("quota", name, true)?;
        if count == 0 || count > MAX_CALENDAR_COUNT {
            return Err(BuildError::Quota {
                name: name.to_owned(),
                reason: format!("{count} per window: give 1 to {MAX_CALENDAR_COUNT}"),
            });
        }
        Ok(RedisQuota {
            backend: self.clone(),
            prefix: DEFAULT_PREFIX.to_owned(),
            name: name.to_owned(),
            count,
            calendar,
        })
    }
}

impl RedisQuota {
    /// The same quota under keys starting `prefix` (`limiter` unless changed, as a stack's),
    /// so a least-privilege ACL user's key pattern (`~<prefix>:*`) covers them. A prefix that
    /// is empty or holds `{` or `}` is refused.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, BuildError> {
        check_name("prefix", prefix, true)?;
        self.prefix = prefix.to_owned();
        Ok(self)
    }

    /// The most units per window.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The calendar.
    pub fn calendar(&self) -> &Calendar {
        &self.calendar
    }

    /// Counts `cost` units for `key` in the window Redis's clock is in (`at_unix_ns`: the
    /// caller's clock, which picks the window it and the next one are). A cost above the count
    /// is never admitted; a Redis failure is an error, never a decision.
    pub async fn take(
        &self,
        key: &str,
        cost: u64,
        at_unix_ns: u64,
    ) -> Result<QuotaAnswer, BackendError> {
        self.count_in(key, cost, at_unix_ns, false).await
    }

    /// Records `cost` units for `key` that were already used, whatever the window holds (up to
    /// twice its count, as every limit here holds at most that much debt): admitted while the
    /// window is still within its count, and every later call of the window denied once it is
    /// not. The window is picked as [`take`](Self::take) picks it.
    pub async fn record(
        &self,
        key: &str,
        cost: u64,
        at_unix_ns: u64,
    ) -> Result<QuotaAnswer, BackendError> {
        self.count_in(key, cost, at_unix_ns, true).await
    }

    /// Counts `cost` in the window Redis's clock is in: a take, or (`record`) whatever it holds.
    async fn count_in(
        &self,
        key: &str,
        cost: u64,
        at_unix_ns: u64,
        record: bool,
    ) -> Result<QuotaAnswer, BackendError> {
        let this = self.window(at_unix_ns)?;
        let next = self.window(this.end_unix_ns)?;
        let ms = |ns: u64| (ns / 1_000_000).to_string();
        let args = [
            cost.to_string(),
            self.count.to_string(),
            this.index.to_string(),
            ms(this.end_unix_ns),
            next.index.to_string(),
            ms(next.end_unix_ns),
            u8::from(record).to_string(),
            self.count.saturating_mul(Usage::MAX_DEBT).to_string(),
            calendar_id(&self.calendar),
        ];
        let reply = self.run(key, TAKE, true, &args).await?;
        // The window Redis counted in: ours, or the next when its clock had passed ours.
        let [admitted, used, left_ms, window] = numbers(&reply)?;
        // Redis counts the milliseconds left on its own clock when the script runs: later
        // than the caller's reading by the round trip, rounded down to the millisecond. The
        // window's end, measured from the caller's reading, is when it is full again: its
        // reading plus that is the boundary exactly, as in process, whatever the clocks say.
        // A denial's wait is that too where the clocks agree (the end at most a millisecond
        // short of Redis's wait, at most `ROUND_TRIP` past it), else Redis's own, so no caller
        // is told to come back before Redis's clock reaches the end.
        const ROUND_TRIP: u64 = 100_000_000;
        let left = left_ms.saturating_mul(1_000_000);
        let end = if window == next.index {
            Some(next.end_unix_ns)
        } else {
            (window == this.index).then_some(this.end_unix_ns)
        };
        let exact = end.and_then(|end| end.checked_sub(at_unix_ns));
        let wait = match exact {
            Some(exact)
                if exact.saturating_add(1_000_000) > left
                    && exact <= left.saturating_add(ROUND_TRIP) =>
            {
                exact
            }
            _ => left,
        }
        .max(1);
        let full_again = exact.unwrap_or(wait).max(1);
        let decision = if admitted == 1 {
            // A window that counts nothing is full now, as in process.
            let reset = if used == 0 { 0 } else { full_again };
            Decision::allow(self.count, self.count.saturating_sub(used), reset)
        } else {
            Decision::deny(
                self.count,
                self.count.saturating_sub(used),
                wait,
                full_again,
            )
        };
        Ok(QuotaAnswer { decision, window })
    }

    /// Gives `units` back to `key` in `window` (a take whose call was then refused elsewhere):
    /// nothing once that window has passed.
    pub async fn refund(&self, key: &str, units: u64, window: u64) -> Result<(), BackendError> {
        self.run(key, REFUND, false, &[units.to_string(), window.to_string()])
            .await
            .map(drop)
    }

    fn window(&self, unix_ns: u64) -> Result<Window, BackendError> {
        self.calendar.window(unix_ns).ok_or_else(|| {
            BackendError::Script(format!(
                "the instant {unix_ns} ns is past the calendar's range"
            ))
        })
    }

    /// Runs `body` on `key`'s counter (`timed`: `now` read first, see
    /// [`RedisBackend::eval_on_key`]).
    async fn run(
        &self,
        key: &str,
        body: &'static str,
        timed: bool,
        args: &[String],
    ) -> Result<Value, BackendError> {
        let redis_key = format!("{}:quota:{}:{{{key}}}", self.prefix, self.name);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.backend
            .eval_on_key(&redis_key, body, timed, &args)
            .await
    }
}

/// What a counter names its calendar by (`1mo@Europe/Berlin`): a counter written under
/// another keeps its consumption in this one's window (see [`TAKE`]).
fn calendar_id(calendar: &Calendar) -> String {
    format!("{}@{}", calendar.unit().period(), calendar.zone())
}

fn numbers(reply: &Value) -> Result<[u64; 4], BackendError> {
    let bad = || BackendError::BadReply(format!("a quota script answered {reply:?}"));
    match reply {
        Value::Array(items) if items.len() == 4 => {
            let mut out = [0u64; 4];
            for (slot, item) in out.iter_mut().zip(items) {
                *slot = match item {
                    Value::Int(n) => u64::try_from(*n).map_err(|_| bad())?,
                    _ => return Err(bad()),
                };
            }
            Ok(out)
        }
        _ => Err(bad()),
    }
}
