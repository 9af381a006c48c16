//! Reading the script's reply: checked field by field, so a reply the script never sends is a
//! clear [`BackendError::BadReply`], not a panic or a made-up decision.
#![deny(clippy::arithmetic_side_effects)]

use redis::Value;

use crate::error::BackendError;

/// One limit's answer, times in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LimitAnswer {
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) retry_after_us: u64,
    pub(crate) reset_after_us: u64,
}

/// One group's answer: every limit's, or the script's reason for refusing the group.
pub(crate) type GroupAnswer = Result<Vec<LimitAnswer>, String>;

fn bad(what: impl Into<String>) -> BackendError {
    BackendError::BadReply(what.into())
}

fn number(value: &Value, what: &str) -> Result<u64, BackendError> {
    match value {
        Value::Int(n) => u64::try_from(*n).map_err(|_| bad(format!("{what} is negative ({n})"))),
        // Past u64::MAX (a wait of centuries, sent as digits) saturates, as the Rust twin does.
        Value::BulkString(bytes) => std::str::from_utf8(bytes)
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .map(|s| s.parse().unwrap_or(u64::MAX))
            .ok_or_else(|| bad(format!("{what} is not a whole number"))),
        other => Err(bad(format!("{what} is {other:?}, not a number"))),
    }
}

/// The reply to a script call of groups with `sizes[i]` limits each: the time decided at (us)
/// and each group's answer.
pub(crate) fn parse(
    value: &Value,
    sizes: &[usize],
) -> Result<(u64, Vec<GroupAnswer>), BackendError> {
    let (now, groups) = parse_with(value, sizes, false)?;
    Ok((now, groups.into_iter().map(|(_, answer)| answer).collect()))
}

/// The reply to a lease call (mode 3): as [`parse`], with each admitted or denied group's
/// leased units (0 for a group that failed).
pub(crate) fn parse_leases(
    value: &Value,
    sizes: &[usize],
) -> Result<(u64, Vec<(u64, GroupAnswer)>), BackendError> {
    parse_with(value, sizes, true)
}

fn parse_with(
    value: &Value,
    sizes: &[usize],
    leased: bool,
) -> Result<(u64, Vec<(u64, GroupAnswer)>), BackendError> {
    let Value::Array(items) = value else {
        return Err(bad(format!("expected an array, got {value:?}")));
    };
    let mut items = items.iter();
    let now = number(
        items.next().ok_or_else(|| bad("the reply is empty"))?,
        "the time",
    )?;
    let mut groups = Vec::with_capacity(sizes.len());
    for (g, &size) in sizes.iter().enumerate() {
        let status = items
            .next()
            .ok_or_else(|| bad(format!("group {g} is missing")))?;
        let admitted = match status {
            Value::Int(0) => false,
            Value::Int(1) => true,
            Value::BulkString(bytes) => {
                groups.push((0, Err(String::from_utf8_lossy(bytes).into_owned())));
                continue;
            }
            other => return Err(bad(format!("group {g} has status {other:?}"))),
        };
        let lease = if leased {
            let value = items
                .next()
                .ok_or_else(|| bad(format!("group {g} has no lease")))?;
            number(value, "lease")?
        } else {
            0
        };
        let mut answers = Vec::with_capacity(size);
        for i in 0..size {
            let mut field = |name: &str| {
                items
                    .next()
                    .ok_or_else(|| bad(format!("limit {i} of group {g} has no {name}")))
                    .and_then(|v| number(v, name))
            };
            let allowed = match field("allowed flag")? {
                0 => false,
                1 => true,
                n => return Err(bad(format!("limit {i} of group {g} has allowed flag {n}"))),
            };
            answers.push(LimitAnswer {
                allowed,
                remaining: field("remaining")?,
                retry_after_us: field("retry_after")?,
                reset_after_us: field("reset_after")?,
            });
        }
        if admitted != answers.iter().all(|a| a.allowed) {
            return Err(bad(format!(
                "group {g} says admitted={admitted}, which its limits contradict"
            )));
        }
        groups.push((lease, Ok(answers)));
    }
    if items.next().is_some() {
        return Err(bad("the reply is longer than the call"));
    }
    Ok((now, groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&v| Value::Int(v)).collect())
    }

    #[test]
    fn reads_groups_errors_and_big_numbers() {
        let reply = Value::Array(vec![
            Value::Int(7),
            Value::Int(1),
            Value::Int(1),
            Value::Int(9),
            Value::Int(0),
            Value::BulkString(b"18014398509481984".to_vec()),
            Value::BulkString(b"limiter: key k holds junk".to_vec()),
        ]);
        let (now, groups) = parse(&reply, &[1, 1]).unwrap();
        assert_eq!(now, 7);
        assert_eq!(
            groups[0],
            Ok(vec![LimitAnswer {
                allowed: true,
                remaining: 9,
                retry_after_us: 0,
                reset_after_us: 1 << 54,
            }])
        );
        assert_eq!(groups[1], Err("limiter: key k holds junk".to_owned()));
    }

    #[test]
    fn refuses_replies_the_script_never_sends() {
        for (reply, sizes, expect) in [
            (Value::Okay, vec![1], "expected an array"),
            (ints(&[]), vec![1], "empty"),
            (ints(&[1]), vec![1], "group 0 is missing"),
            (ints(&[1, 1, 1, 5]), vec![1], "no retry_after"),
            (ints(&[1, 1, 2, 5, 0, 0]), vec![1], "allowed flag 2"),
            (ints(&[1, 1, 0, 5, 3, 3]), vec![1], "contradict"),
            (ints(&[1, 1, -1, 5, 0, 0]), vec![1], "negative"),
            (ints(&[1, 0, 0, 5, 3, 3, 9]), vec![1], "longer"),
            (ints(&[1, 4]), vec![0], "status"),
        ] {
            let error = parse(&reply, &sizes).unwrap_err().to_string();
            assert!(error.contains(expect), "{error:?} should say {expect:?}");
        }
    }
}
