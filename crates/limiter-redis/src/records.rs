//! [`RedisRecords`]: a named set of small records kept in Redis beside the limits (one hash,
//! and a version counter every change moves on), for a service's run-time data that every
//! node must see (limiterd's overrides). A change and its version move in one script call, so
//! a node that reads the version and then the records never misses a change; nodes poll the
//! version (one `GET`) and read the records again only when it moved. A change answers the
//! version after it, so the node that made it, holding the version just before, knows its copy
//! is Redis's without reading it back.
//!
//! Both keys share a hash tag, so on a cluster they live in one slot.

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
",
            $body
        )
    };
}

/// Sets a field and moves the version on: `ARGV = [field, value]`.
const PUT: &str = checked!(
    "local _, err = hashed('HSET', KEYS[1], ARGV[1], ARGV[2]) if err then return err end
return redis.call('INCR', KEYS[2])"
);
/// Deletes a field and, if it was there, moves the version on: the version after, or nil
/// when there was no such field.
const REMOVE: &str = checked!(
    "local n, err = hashed('HDEL', KEYS[1], ARGV[1]) if err then return err end
if n > 0 then return redis.call('INCR', KEYS[2]) end
return false"
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
    keys: [String; 2],
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

/// The hash and version keys of the records `name` under `prefix`, one hash tag.
fn keys(prefix: &str, name: &str) -> [String; 2] {
    let tag = format!("{prefix}:{{records:{name}}}");
    [format!("{tag}:hash"), format!("{tag}:version")]
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
            .eval_on_keys(&self.keys[0], &[&self.keys[1]], body, false, args)
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
            .read_on_keys(&self.keys[0], &[&self.keys[1]], ALL, &[])
            .await?;
        let Value::Array(parts) = reply else {
            return Err(bad(&reply));
        };
        let (Some(version), Some(Value::Array(flat))) = (parts.first(), parts.get(1)) else {
            return Err(bad(&Value::Array(parts)));
        };
        let version = self.version_in(version)?;
        let mut fields = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks(2) {
            if let [field, value] = pair {
                fields.push((lossy(field)?, lossy(value)?));
            }
        }
        Ok((version, fields))
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
