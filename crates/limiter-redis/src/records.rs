//! [`RedisRecords`]: a named set of small records kept in Redis beside the limits (one hash,
//! a version counter every change moves on, and a log of the last [`LOGGED_CHANGES`]
//! changes), for a service's run-time data that every node must see (limiterd's overrides). A
//! change, its version and its log entry move in one script call, so a node that reads the
//! version and then the records never misses a change; nodes poll the version (one `GET`) and,
//! when it moved, read only the changes since the version they hold ([`RedisRecords::since`]),
//! or every record when the log no longer holds them all. A change answers the version after
//! it, so the node that made it, holding the version just before, knows its copy is Redis's
//! without reading it back.
//!
//! The three keys share a hash tag, so on a cluster they live in one slot.

use redis::Value;

use crate::backend::RedisBackend;
use crate::error::{BackendError, BuildError};
use crate::stack::DEFAULT_PREFIX;
use crate::stack::build::check_name;

/// A records script: `body` after a check that refuses a version that is not a whole number
/// (another type, or a value no change wrote), naming the key, before anything is written;
/// `version` holds the version read (`false` before any change). The body runs its first
/// command on the hash through `hashed`, which refuses a hash key of another type the same way
/// (Redis runs a command on a key of another type not at all). No command beyond those of
/// the documented least-privilege ACL user (no `TYPE`).
macro_rules! checked {
    ($body:literal) => {
        concat!(
            "local function refused(key, what, detail)
  return redis.error_reply('limiter: key ' .. key .. ' is not ' .. what .. ' (' .. detail .. '); delete it or change the prefix')
end
local function hashed(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then return nil, refused(KEYS[1], 'a records hash', reply.err) end
  return reply
end
local version = redis.pcall('GET', KEYS[2])
if type(version) == 'table' and version.err then return refused(KEYS[2], 'a records version', version.err) end
if version and not string.match(version, '^%d+$') then
  return refused(KEYS[2], 'a records version', 'it holds \"' .. string.sub(version, 1, 40) .. '\"')
end
local logged = redis.pcall('ZCARD', KEYS[3])
if type(logged) == 'table' and logged.err then return refused(KEYS[3], 'a records log', logged.err) end
local function log(v, entry)
  redis.call('ZADD', KEYS[3], v, v .. ':' .. entry)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', v - 1000)
  return v
end
",
            $body
        )
    };
}

/// Sets a field, moves the version on and logs the change: `ARGV = [field, value]`.
const PUT: &str = checked!(
    "local _, err = hashed('HSET', KEYS[1], ARGV[1], ARGV[2]) if err then return err end
return log(redis.call('INCR', KEYS[2]), 's:' .. #ARGV[1] .. ':' .. ARGV[1] .. ARGV[2])"
);
/// Deletes a field and, if it was there, moves the version on and logs the change: the
/// version after, or nil when there was no such field.
const REMOVE: &str = checked!(
    "local n, err = hashed('HDEL', KEYS[1], ARGV[1]) if err then return err end
if n > 0 then return log(redis.call('INCR', KEYS[2]), 'd:' .. #ARGV[1] .. ':' .. ARGV[1]) end
return false"
);
/// What changed since version `ARGV[1]`: the version alone when nothing did; the logged
/// changes since, in order, when the log holds every one of them; else every field.
const SINCE: &str = checked!(
    "local now, seen = tonumber(version or '0'), tonumber(ARGV[1])
if now == seen then return {tostring(now)} end
if seen < now and now - seen <= 1000 then
  local entries = redis.call('ZRANGE', KEYS[3], -(now - seen), -1)
  if #entries == now - seen and string.match(entries[1], '^%d+') == tostring(seen + 1)
    and string.match(entries[#entries], '^%d+') == tostring(now) then
    return {tostring(now), 'changes', entries}
  end
end
local fields, err = hashed('HGETALL', KEYS[1]) if err then return err end
return {tostring(now), 'whole', fields}"
);
/// The version and every field, read together.
const ALL: &str = checked!(
    "local fields, err = hashed('HGETALL', KEYS[1]) if err then return err end
return {version or '0', fields}"
);

/// A named set of records in Redis (see the module docs).
#[derive(Clone, Debug)]
pub struct RedisRecords {
    backend: RedisBackend,
    name: String,
    keys: [String; 3],
}

impl RedisBackend {
    /// The records named `name` (keys `limiter:{records:<name>}:hash` and `…:version`;
    /// [`with_prefix`](RedisRecords::with_prefix) changes the first part). A name that is
    /// empty or holds `{` or `}` is refused.
    pub fn records(&self, name: &str) -> Result<RedisRecords, BuildError> {
        check_name("records", name, true)?;
        Ok(RedisRecords {
            backend: self.clone(),
            name: name.to_owned(),
            keys: keys(DEFAULT_PREFIX, name),
        })
    }
}

/// The hash, version and log keys of the records `name` under `prefix`, one hash tag.
fn keys(prefix: &str, name: &str) -> [String; 3] {
    let tag = format!("{prefix}:{{records:{name}}}");
    [
        format!("{tag}:hash"),
        format!("{tag}:version"),
        format!("{tag}:log"),
    ]
}

impl RedisRecords {
    /// The same records under keys starting `prefix` (`limiter` unless changed, as a stack's),
    /// so a least-privilege ACL user's key pattern (`~<prefix>:*`) covers them. A prefix that
    /// is empty or holds `{` or `}` is refused.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, BuildError> {
        check_name("prefix", prefix, true)?;
        self.keys = keys(prefix, &self.name);
        Ok(self)
    }

    /// Runs `body` on the records' two keys (by its hash, as every one-key script).
    async fn script(&self, body: &'static str, args: &[&str]) -> Result<Value, BackendError> {
        self.backend
            .eval_on_keys(
                &self.keys[0],
                &[&self.keys[1], &self.keys[2]],
                body,
                false,
                args,
            )
            .await
    }

    /// Sets `field` to `value`; the version after the change (see [`remove`](Self::remove)).
    pub async fn put(&self, field: &str, value: &str) -> Result<u64, BackendError> {
        let reply = self.script(PUT, &[field, value]).await?;
        number(&reply)
    }

    /// Deletes `field`: the version after the change, or `None` when there was no such field
    /// (nothing changed). A reader that held the version just before can move its copy to
    /// this one by the same change, without reading the records again.
    pub async fn remove(&self, field: &str) -> Result<Option<u64>, BackendError> {
        match self.script(REMOVE, &[field]).await? {
            Value::Nil => Ok(None),
            reply => number(&reply).map(Some),
        }
    }

    /// The version now (0 before any change); an error naming the key when it holds what no
    /// change wrote.
    pub async fn version(&self) -> Result<u64, BackendError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(&self.keys[1]);
        match self.backend.query(&self.keys[1], &cmd).await {
            Ok(Value::Nil) => Ok(0),
            Ok(other) => self.version_in(&other),
            Err(BackendError::Redis(e)) if e.contains("WRONGTYPE") => {
                Err(BackendError::BadReply(format!(
                    "records: key {} is not a records version ({e}); delete it or change the \
                     prefix",
                    self.keys[1]
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// The version `reply` holds, or an error naming the version's key and the fix.
    fn version_in(&self, reply: &Value) -> Result<u64, BackendError> {
        number(reply).map_err(|_| {
            BackendError::BadReply(format!(
                "records: key {} holds {}, not a version; delete it (the next change starts \
                 it again, and every reader reads the records whole)",
                self.keys[1],
                shown(reply)
            ))
        })
    }

    /// The version and every `(field, value)`, as of one instant. A field or value that is
    /// not UTF-8 is read with its bad bytes replaced (U+FFFD), so its reader sees a record it
    /// cannot read and the records beside it still read.
    pub async fn all(&self) -> Result<(u64, Vec<(String, String)>), BackendError> {
        let reply = self
            .backend
            .read_on_keys(&self.keys[0], &[&self.keys[1], &self.keys[2]], ALL, &[])
            .await?;
        let Value::Array(parts) = reply else {
            return Err(bad(&reply));
        };
        let (Some(version), Some(Value::Array(flat))) = (parts.first(), parts.get(1)) else {
            return Err(bad(&Value::Array(parts)));
        };
        let version = self.version_in(version)?;
        Ok((version, pairs(flat)?))
    }

    /// What changed since version `seen` (one script call): nothing, the changes since in
    /// order (each change is logged, the last [`LOGGED_CHANGES`] kept), or, for a reader
    /// further behind or past a change no log holds (one by a version that did not log),
    /// every field, as [`all`](Self::all) reads them.
    pub async fn since(&self, seen: u64) -> Result<Since, BackendError> {
        let seen_text = seen.to_string();
        let reply = self
            .backend
            .read_on_keys(
                &self.keys[0],
                &[&self.keys[1], &self.keys[2]],
                SINCE,
                &[&seen_text],
            )
            .await?;
        let Value::Array(parts) = reply else {
            return Err(bad(&reply));
        };
        let version = match parts.first() {
            Some(version) => self.version_in(version)?,
            None => return Err(bad(&Value::Array(parts))),
        };
        match (parts.get(1).map(text).transpose()?.as_deref(), parts.get(2)) {
            (None, _) => Ok(Since::Unchanged),
            (Some("changes"), Some(Value::Array(entries))) => {
                match entries.iter().map(logged).collect::<Option<_>>() {
                    Some(changes) => Ok(Since::Changes { version, changes }),
                    // An entry no version of this code wrote: read them whole instead.
                    None => {
                        let (version, fields) = self.all().await?;
                        Ok(Since::Whole { version, fields })
                    }
                }
            }
            (Some("whole"), Some(Value::Array(flat))) => Ok(Since::Whole {
                version,
                fields: pairs(flat)?,
            }),
            _ => Err(bad(&Value::Array(parts))),
        }
    }
}

/// How many changes the records' log keeps: a reader further behind reads them whole.
pub const LOGGED_CHANGES: u64 = 1_000;

/// What changed in records since a version ([`RedisRecords::since`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Since {
    /// Nothing.
    Unchanged,
    /// Every change since, in order: a field set to a value (`Some`) or deleted (`None`).
    Changes {
        /// The version after them.
        version: u64,
        /// The changes.
        changes: Vec<(String, Option<String>)>,
    },
    /// Every field (the log did not hold every change since).
    Whole {
        /// The version read.
        version: u64,
        /// Every `(field, value)`.
        fields: Vec<(String, String)>,
    },
}

/// A flat `[field, value, …]` reply as pairs.
fn pairs(flat: &[Value]) -> Result<Vec<(String, String)>, BackendError> {
    let mut fields = Vec::with_capacity(flat.len() / 2);
    for pair in flat.chunks(2) {
        if let [field, value] = pair {
            fields.push((lossy(field)?, lossy(value)?));
        }
    }
    Ok(fields)
}

/// A logged change, `<version>:<s|d>:<field length>:<field><value>`, as a field and its value
/// (`None`: deleted); `None` for an entry not of that shape.
fn logged(entry: &Value) -> Option<(String, Option<String>)> {
    let Value::BulkString(bytes) = entry else {
        return None;
    };
    let whole = std::str::from_utf8(bytes).ok()?;
    let mut parts = whole.splitn(4, ':');
    let (_version, op, length, rest) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let length: usize = length.parse().ok()?;
    let field = rest.get(..length)?.to_owned();
    match op {
        "s" => Some((field, Some(rest.get(length..)?.to_owned()))),
        "d" if rest.len() == length => Some((field, None)),
        _ => None,
    }
}

fn bad(reply: &Value) -> BackendError {
    BackendError::BadReply(format!("records: an unexpected reply {reply:?}"))
}

fn text(value: &Value) -> Result<String, BackendError> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).map_err(|_| bad(value)),
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(bad(other)),
    }
}

/// A field or value of the records hash as text, bad UTF-8 replaced.
fn lossy(value: &Value) -> Result<String, BackendError> {
    match value {
        Value::BulkString(bytes) => Ok(String::from_utf8_lossy(bytes).into_owned()),
        other => text(other),
    }
}

/// A reply as an operator would recognise it: its text (at most 40 characters), else its shape.
fn shown(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => {
            let text: String = String::from_utf8_lossy(bytes).chars().take(40).collect();
            format!("{text:?}")
        }
        other => format!("{other:?}"),
    }
}

fn number(value: &Value) -> Result<u64, BackendError> {
    match value {
        Value::Int(n) => u64::try_from(*n).map_err(|_| bad(value)),
        other => text(other)?.parse().map_err(|_| bad(other)),
    }
}
