//! The decision script: its Lua source (`decide.lua`), how a server gets it (loaded once as a
//! Redis Function library where the server has functions, run by `EVALSHA` elsewhere), the
//! call's encoding ([`call`]) and the reply's decoding ([`reply`]).
//!
//! The library's name carries a hash of its source (`limiter_<hash>`), so nodes running
//! different versions of this crate on one Redis each call their own code, and an upgrade
//! never needs a flush: a new version loads beside the old one.
#![deny(clippy::arithmetic_side_effects)]

pub(crate) mod call;
pub(crate) mod reply;
pub(crate) mod run;

/// The decision script's Lua source: every algorithm's transition, for a whole stack or batch
/// at once, as a library whose entry point is `decide(KEYS, ARGV)`.
const LIBRARY: &str = include_str!("decide.lua");

/// The decision script as `EVAL` runs it: the library, then a call of its entry point.
/// Public so benchmarks can time a raw call; see [`RedisLimit::call_argument`](crate::RedisLimit::call_argument)
/// for its argument.
pub const SCRIPT: &str = concat!(include_str!("decide.lua"), "\nreturn decide(KEYS, ARGV)\n");

/// The script in both forms a server runs it, with the names that version it.
pub(crate) struct Scripts {
    /// `EVALSHA` / `EVAL` (servers before Redis 7, or where functions are refused).
    pub(crate) eval: redis::Script,
    /// The Function library's source, for `FUNCTION LOAD REPLACE`.
    pub(crate) library: String,
    /// The function `FCALL` names.
    pub(crate) function: String,
    /// The function a cluster node runs coalesced decisions of several slots with: no keys
    /// declared, the keys after the call in `ARGV`, flagged `allow-cross-slot-keys`.
    pub(crate) node_function: String,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let eval = redis::Script::new(SCRIPT);
        // The first 16 hex digits of the script's SHA-1: the version.
        let version: String = eval.get_hash().chars().take(16).collect();
        let function = format!("limiter_decide_{version}");
        let node_function = format!("limiter_node_{version}");
        let library = format!(
            "#!lua name=limiter_{version}\n{LIBRARY}\nredis.register_function('{function}', decide)\n\
             redis.register_function{{function_name='{node_function}', callback=decide_node, flags={{'allow-cross-slot-keys'}}}}\n"
        );
        Self {
            eval,
            library,
            function,
            node_function,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_named_by_its_version_and_registers_its_function() {
        let scripts = Scripts::new();
        assert!(scripts.function.starts_with("limiter_decide_"));
        assert_eq!(scripts.function.len(), "limiter_decide_".len() + 16);
        let first_line = scripts.library.lines().next().unwrap();
        assert_eq!(
            first_line,
            format!("#!lua name=limiter_{}", &scripts.function[15..])
        );
        assert!(scripts.library.contains(&format!(
            "register_function('{}', decide)",
            scripts.function
        )));
        assert!(scripts.library.contains(&format!(
            "function_name='{}', callback=decide_node, flags={{'allow-cross-slot-keys'}}",
            scripts.node_function
        )));
        assert!(SCRIPT.ends_with("return decide(KEYS, ARGV)\n"));
    }
}
