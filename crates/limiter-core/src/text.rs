//! The text forms configuration files share (limiterd's TOML, envoy's descriptor YAML):
//! periods (`"500ms"`, `"1s"`, `"1h"`) and percentages (`"2.5%"`), parsed exactly, with no
//! float.

use std::time::Duration;

/// `"500ms"`, `"1s"`, `"15m"`, `"1h"`, `"1d"`: a whole number and a unit.
pub fn parse_period(text: &str) -> Option<Duration> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let n: u64 = number.parse().ok()?;
    let nanos_per = match unit {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return None,
    };
    n.checked_mul(nanos_per).map(Duration::from_nanos)
}

/// `"N%"` (N a decimal with at most four places, at most 100) in parts per million.
pub fn parse_percent(text: &str) -> Option<u64> {
    let number = text.trim().strip_suffix('%')?.trim();
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty()
        || fraction.len() > 4
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut places: u64 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().ok()?
    };
    for _ in fraction.len()..4 {
        places *= 10;
    }
    let ppm = whole.checked_mul(10_000)?.checked_add(places)?;
    (ppm <= 1_000_000).then_some(ppm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_a_whole_number_and_a_unit() {
        assert_eq!(parse_period("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_period("1d"), Some(Duration::from_secs(86_400)));
        for bad in ["", "1", "ms", "1.5s", "-1s", "1 s", "99999999999999999999d"] {
            assert_eq!(parse_period(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn percentages_are_parts_per_million_up_to_100() {
        assert_eq!(parse_percent("2.5%"), Some(25_000));
        assert_eq!(parse_percent(" 100 %"), Some(1_000_000));
        assert_eq!(parse_percent(".0001%"), Some(1));
        for bad in ["", "%", "5", "100.01%", "1.00001%", "-1%", "x%"] {
            assert_eq!(parse_percent(bad), None, "{bad:?}");
        }
    }
}
