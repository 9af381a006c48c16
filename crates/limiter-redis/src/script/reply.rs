//! Reading the script's reply, checked field by field, so a reply the script never sends is a
//! clear [`BackendError::BadReply`], not a panic or a made-up decision.
//!
//! The reply is one string of big-endian doubles: the time decided at (µs), then per group
//! either admitted (0/1), the units leased and kept (lease calls only), and per limit allowed (0/1),
//! remaining, retry_after_us, reset_after_us; or 2 when the script refused that group alone,
//! the length of its reason, and the reason (`limiter: <why>`).
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

/// What a lease call's group leased: the new units, and how many of the holder's live lease
/// it counts as still held (a lease renewed ahead keeps them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Leased {
    pub(crate) units: u64,
    pub(crate) kept: u64,
}

fn bad(what: impl Into<String>) -> BackendError {
    BackendError::BadReply(what.into())
}

/// A whole, non-negative number from the script; past `u64::MAX` (a wait of centuries)
/// saturates, as the Rust twin does.
fn whole(value: f64, what: &str) -> Result<u64, BackendError> {
    if !(value >= 0.0 && value.fract() == 0.0) {
        return Err(bad(format!("{what} is {value}, not a whole number")));
    }
    // Checked above: whole and non-negative; the cast saturates past u64::MAX.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(value as u64)
}

/// The reply to a script call of groups with `sizes[i]` limits each: the time decided at (µs)
/// and each group's answer.
pub(crate) fn parse(
    value: &Value,
    sizes: &[usize],
) -> Result<(u64, Vec<GroupAnswer>), BackendError> {
    let (now, groups) = parse_with(value, sizes, false)?;
    Ok((now, groups.into_iter().map(|(_, answer)| answer).collect()))
}

/// The reply to a lease call: as [`parse`], with what each admitted or denied group leased
/// (nothing for a group that failed).
pub(crate) fn parse_leases(
    value: &Value,
    sizes: &[usize],
) -> Result<(u64, Vec<(Leased, GroupAnswer)>), BackendError> {
    parse_with(value, sizes, true)
}

fn parse_with(
    value: &Value,
    sizes: &[usize],
    leased: bool,
) -> Result<(u64, Vec<(Leased, GroupAnswer)>), BackendError> {
    let Value::BulkString(bytes) = value else {
        return Err(bad(format!("expected a string, got {value:?}")));
    };
    let mut reader = Reader { bytes, at: 0 };
    let now = reader.whole("the time")?;
    let mut groups = Vec::with_capacity(sizes.len());
    for (g, &size) in sizes.iter().enumerate() {
        let admitted = match reader
            .whole("a group's flag")
            .map_err(|e| match reader.at {
                at if at > bytes.len() => bad(format!("group {g} is missing")),
                _ => e,
            })? {
            0 => false,
            1 => true,
            2 => {
                let length = reader.whole("a reason's length")?;
                let reason = reader
                    .take(usize::try_from(length).unwrap_or(usize::MAX))
                    .ok_or_else(|| bad(format!("group {g}'s reason is cut short")))?;
                let reason = String::from_utf8_lossy(reason).into_owned();
                groups.push((Leased::default(), Err(reason)));
                continue;
            }
            n => return Err(bad(format!("group {g} has flag {n}"))),
        };
        let lease = if leased {
            Leased {
                units: reader.whole("the lease")?,
                kept: reader.whole("the units kept")?,
            }
        } else {
            Leased::default()
        };
        let mut answers = Vec::with_capacity(size);
        for i in 0..size {
            let allowed = match reader.whole("an allowed flag")? {
                0 => false,
                1 => true,
                n => return Err(bad(format!("limit {i} of group {g} has allowed flag {n}"))),
            };
            answers.push(LimitAnswer {
                allowed,
                remaining: reader.whole("remaining")?,
                retry_after_us: reader.whole("retry_after")?,
                reset_after_us: reader.whole("reset_after")?,
            });
        }
        if admitted != answers.iter().all(|a| a.allowed) {
            return Err(bad(format!(
                "group {g} says admitted={admitted}, which its limits contradict"
            )));
        }
        groups.push((lease, Ok(answers)));
    }
    if reader.at < bytes.len() {
        return Err(bad("the reply is longer than the call"));
    }
    Ok((now, groups))
}

/// Reads the reply's numbers in order.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n)?;
        let taken = self.bytes.get(self.at..end);
        self.at = end;
        taken
    }

    /// The next number, which must be whole and non-negative.
    fn whole(&mut self, what: &str) -> Result<u64, BackendError> {
        let raw = self
            .take(8)
            .ok_or_else(|| bad(format!("the reply ends before {what}")))?;
        let mut number = [0u8; 8];
        number.copy_from_slice(raw);
        whole(f64::from_be_bytes(number), what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(values: &[f64]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_be_bytes()).collect()
    }

    fn reply(parts: &[&[u8]]) -> Value {
        Value::BulkString(parts.concat())
    }

    #[test]
    fn reads_groups_errors_and_big_numbers() {
        let reason = b"limiter: key k holds junk";
        let value = reply(&[
            &numbers(&[7.0]),
            &numbers(&[1.0, 1.0, 9.0, 0.0, 18_014_398_509_481_984.0]),
            &numbers(&[2.0, reason.len() as f64]),
            reason,
            &numbers(&[0.0, 0.0, 0.0, 1e30, 5.0]),
        ]);
        let (now, groups) = parse(&value, &[1, 1, 1]).unwrap();
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
        assert_eq!(
            groups[2].as_ref().unwrap()[0].retry_after_us,
            u64::MAX,
            "saturates"
        );
        let leased = reply(&[&numbers(&[7.0, 1.0, 4.0, 5.0, 1.0, 2.0, 0.0, 3.0])]);
        let (_, groups) = parse_leases(&leased, &[1]).unwrap();
        assert_eq!(groups[0].0, Leased { units: 4, kept: 5 });
    }

    #[test]
    fn refuses_replies_the_script_never_sends() {
        let with = |group: &[f64]| reply(&[&numbers(&[1.0]), &numbers(group)]);
        for (value, sizes, expect) in [
            (Value::Okay, vec![1], "expected a string"),
            (reply(&[]), vec![1], "before the time"),
            (reply(&[&numbers(&[-1.0])]), vec![1], "not a whole number"),
            (reply(&[&numbers(&[1.0])]), vec![1], "group 0 is missing"),
            (with(&[1.0, 1.0, 1.0, 5.0]), vec![1], "before reset_after"),
            (with(&[1.0, 2.0, 5.0, 0.0, 0.0]), vec![1], "allowed flag 2"),
            (with(&[1.0, 0.0, 5.0, 3.0, 3.0]), vec![1], "contradict"),
            (
                with(&[1.0, 1.0, -1.0, 0.0, 0.0]),
                vec![1],
                "not a whole number",
            ),
            (
                with(&[1.0, 1.0, 0.5, 0.0, 0.0]),
                vec![1],
                "not a whole number",
            ),
            (
                with(&[1.0, 1.0, f64::NAN, 0.0, 0.0]),
                vec![1],
                "not a whole number",
            ),
            (with(&[3.0]), vec![0], "flag 3"),
            (with(&[2.0, 100.0]), vec![0], "cut short"),
            (with(&[1.0, 1.0]), vec![0], "longer"),
        ] {
            let error = parse(&value, &sizes).unwrap_err().to_string();
            assert!(error.contains(expect), "{error:?} should say {expect:?}");
        }
    }
}
