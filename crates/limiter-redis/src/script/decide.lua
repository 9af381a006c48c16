-- limiter-redis: every algorithm's pure transition, decided for a whole call in one function.
--
-- The same arithmetic as the Rust algorithms (limiter-token-bucket's Gcra, limiter-sliding-
-- window's WindowCounter), with time in microseconds since the Unix epoch. Loaded once as a
-- Redis Function library (FCALL), so nothing here is rebuilt per call; on a server without
-- functions the same text runs by EVALSHA (the caller appends the entry point).
--
-- A state is three numbers and the limit that wrote them, stored as eight big-endian doubles
-- (64 bytes: `struct.pack('>ddd')` of the state, then the limit's five numbers exactly as the
-- call sent them, so the usual check that the same limit wrote it is one string compare; every
-- value an integer below 2^53):
--   token bucket (algorithm 1): at (µs of the write), debt (ticks owed at `at`), 0
--   window counters (2 sliding, 3 fixed): window index (absolute), previous count, current
--   then the writing limit's algorithm, a, b, c, d. A call under another limit (the caller
--   changed it) first rescales the state: the same fraction of the limit's capacity stays in
--   use, rounded up, as the Rust algorithms' `usage` and `with_usage` do. A state written by
--   earlier versions (a decimal u64 word and a `code:a:b:c:d` tag) is read as well.
--
-- The call is one binary argument, ARGV[1], of big-endian doubles (a lease call's holder name
-- is ARGV[2]):
--   header: now_us (-1 reads the server's TIME), the expiry slack in ms (kept on top of the
--   time until a state is full again), the number of groups, the mode (0: each group on its
--   own; 1: all or nothing; 2: refunds; 3: leases), 1 if no key appears in two groups (the
--   caller checked: no state is kept between groups), then each group:
--   modes 0 and 1: cost, kind (1 enforced; 0 a shadow group, which never blocks a batch; 2 a
--     record of usage that already happened, written whatever it finds and never blocking a
--     batch: a state may go into debt, up to twice its capacity in use), the number of limits,
--     and per limit six numbers: KEYS index, algorithm, a, b, c, d
--       algorithm 1 (token bucket): a = q ticks per µs, b = p ticks per unit, c = tau
--         (= burst * p), d = s: a tick is 2^s / q µs (q is 1 when s > 0; readings are floored)
--       algorithm 2 (sliding) / 3 (fixed window): a = count, b = window µs, c = current bits +
--         64 * previous bits + 4096 * granule bits (the previous count is kept in units of
--         2^granule, rounded up), d = index bits + 64 * wrapping (both as the Rust layout is:
--         an old state's word is read with them)
--   mode 2 (refunds): units, granted_us (-1: units taken now, no grant), the number of limits,
--     and the six numbers per limit; it answers as a peek after the refund
--   mode 3 (leases): cost, want, returned, kept, ttl_ms, the number of limits, and per limit
--     the six numbers, then the KEYS index of its lease ledger and its slack in units
-- A group is all or nothing: its writes happen only if every limit admits (a record's always
-- happen; its admitted flag says whether every limit is still within its limit). Groups are
-- decided in order, each on the state the earlier ones left. In mode 1 the batch is all or
-- nothing as well: the writes wait until every group is decided and happen only if every
-- enforced group admitted; otherwise only the records are written (recorded again, in order,
-- on the state as read), and each admitted group is decided again with cost 0 on that state,
-- so it reports what it holds after the batch (as a refunded batch does in process).
--
-- Reply: one string of big-endian doubles (a table would cost more to send): now_us, then per
-- group either admitted (0/1), the units leased and kept (mode 3 only), and per limit allowed (0/1),
-- remaining, retry_after_us, reset_after_us; or 2, when the script refused that group alone
-- (it then writes nothing), the length of the reason, and the reason (`limiter: <why>`).

-- Bound at the first call: a Function library's loading sees no standard libraries.
local floor, pack, unpack
local TWO32 = 4294967296
local LIMIT = 4503599627370496 -- 2^52: every plain number stays below it

-- floor(a / b) and ceil(a / b), exact for 0 <= a, b < 2^52.
local function fdiv(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1 elseif r >= b then q = q + 1 end
  return q
end
local function cdiv(a, b)
  local q = fdiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- floor(a * b / c) (or its ceiling when up), exact for a, b < 2^52 and 0 < c < 2^51.
local function muldiv(a, b, c, up)
  local product = a * b
  if product < 9007199254740992 then
    if up then return cdiv(product, c) end
    return fdiv(product, c)
  end
  -- Long multiplication in 26-bit digits, then long division one bit at a time.
  local B = 67108864
  local a1, b1 = floor(a / B), floor(b / B)
  local a0, b0 = a - a1 * B, b - b1 * B
  local d = { a0 * b0, a1 * b0 + a0 * b1, a1 * b1, 0 }
  for i = 1, 3 do
    local carry = floor(d[i] / B)
    d[i] = d[i] - carry * B
    d[i + 1] = d[i + 1] + carry
  end
  local q, r = 0, 0
  for i = 4, 1, -1 do
    for bit = 25, 0, -1 do
      local digit = floor(d[i] / 2 ^ bit) % 2
      r = r * 2 + digit
      q = q * 2
      if r >= c then r = r - c; q = q + 1 end
    end
  end
  if up and r > 0 then q = q + 1 end
  return q
end

------------------------------------------------------------------------------------------------
-- Token bucket (GCRA). The tat in ticks of 2^s / q µs is `tick(at) + debt`; a unit is p ticks.

-- The tick a reading falls in.
local function tick_of(us, q, s)
  if s > 0 then return floor(us / 2 ^ s) end
  return us * q
end

-- The debt at `now` of a bucket that owed `debt` ticks at `at` (0 once paid back); a reading
-- before `at` (a clock that went back) owes more. nil: a tat far beyond any limit.
local function tb_debt(at, debt, now, q, s)
  if at == nil then return 0 end
  if now >= at then
    local paid
    if s > 0 then
      paid = floor(now / 2 ^ s) - floor(at / 2 ^ s)
    else
      -- (now - at) * q >= debt exactly when now - at >= ceil(debt / q)
      if now - at >= cdiv(debt, q) then return 0 end
      paid = (now - at) * q
    end
    if paid >= debt then return 0 end
    return debt - paid
  end
  local owed
  if s > 0 then owed = debt + floor(at / 2 ^ s) - floor(now / 2 ^ s)
  elseif at - now >= LIMIT then return nil
  else owed = debt + (at - now) * q end
  if owed >= LIMIT then return nil end
  return owed
end

-- From `now`, the wait until tick(now) + ticks is current: the first reading in that tick.
local function tb_until(now, ticks, q, s)
  if s == 0 then return cdiv(ticks, q) end
  local w = ticks * 2 ^ s + floor(now / 2 ^ s) * 2 ^ s - now
  if w < 0 then return 0 end
  return w
end

local FAR = 'owes more than the script counts at this time (Redis\'s clock is behind the key\'s last write); it is decided again once the clock catches up, or delete the key'

-- A call of `cost` on a bucket: allowed, remaining, retry_after, reset_after, and the state
-- to write (at, debt; nil when nothing is written), or nil and an error.
local function tb_decide(at, debt, cost, now, q, p, tau, s)
  debt = tb_debt(at, debt, now, q, s)
  if debt == nil then return nil, FAR end
  local cost_ticks = cost * p
  local budget = tau - cost_ticks
  if debt <= budget then
    local owed = debt + cost_ticks
    if cost > 0 then
      return 1, fdiv(tau - owed, p), 0, tb_until(now, owed, q, s), now, owed
    end
    return 1, fdiv(tau - owed, p), 0, tb_until(now, owed, q, s)
  end
  local headroom = 0
  if tau > debt then headroom = tau - debt end
  return 0, fdiv(headroom, p), tb_until(now, debt - budget, q, s), tb_until(now, debt, q, s)
end

-- A record on a bucket: the debt grows by the cost whatever it is, at most to 2 * tau (never
-- lowered); the answer says whether the bucket is within its limit, and when one unit fits
-- again. Cost 0 is the peek.
local function tb_record(at, debt, cost, now, q, p, tau, s)
  if cost == 0 then return tb_decide(at, debt, 0, now, q, p, tau, s) end
  debt = tb_debt(at, debt, now, q, s)
  if debt == nil then return nil, FAR end
  local owed = debt
  local room = 2 * tau - debt
  if room > 0 then
    -- cost < room / p exactly when cost * p < room (cost is a whole number)
    if cost < room / p then owed = debt + cost * p else owed = 2 * tau end
  end
  if owed <= tau then
    return 1, fdiv(tau - owed, p), 0, tb_until(now, owed, q, s), now, owed
  end
  return 0, 0, tb_until(now, owed - (tau - p), q, s), tb_until(now, owed, q, s), now, owed
end

-- `units` back to a bucket: the debt shrinks by them, never below 0 (never above full). The
-- state to write, nil when nothing comes back, or false and an error.
local function tb_refund(at, debt, units, now, q, p, s)
  debt = tb_debt(at, debt, now, q, s)
  if debt == nil then return false, FAR end
  if debt <= 0 then return nil end
  local left = debt - units * p
  if left < 0 then left = 0 end
  return now, left
end

------------------------------------------------------------------------------------------------
-- Window counters: the counts of window `index` (absolute) and of the one before.

local function granule_of(layout)
  return 2 ^ floor(layout / 4096)
end

-- The counts as of `now`: the window it is in (a reading before the state's own window is
-- taken at that window's start), the previous count (rounded up to its granule) and the
-- current one there, how far into that window, and how far the reading is behind its start.
local function win_read(index, previous, current, now, w, layout, sliding)
  local win = fdiv(now, w)
  if index == nil then return win, 0, 0, now - win * w, 0 end
  -- an empty state is fresh, whatever its index
  if current == 0 and previous == 0 and index > win then index = win end
  if win < index then
    local at = index * w
    return index, previous, current, 0, at - now
  end
  local gap = win - index
  if gap == 1 and sliding then
    local g = granule_of(layout)
    previous = current
    if g > 1 then previous = cdiv(previous, g) * g end
    current = 0
  elseif gap >= 1 then
    previous, current = 0, 0
  end
  return win, previous, current, now - win * w, 0
end

-- The previous window's count weighted by its overlap with the sliding window, rounded up.
local function weigh(previous, elapsed, w, sliding)
  if sliding and previous > 0 then return muldiv(previous, w - elapsed, w, true) end
  return 0
end

-- From `now`, the wait until the counts (`previous`, `current` in window `index`) are empty.
local function win_reset(index, previous, current, now, w, sliding)
  local left
  if current > 0 then
    if sliding then left = 2 else left = 1 end
  elseif sliding and previous > 0 then left = 1
  else return 0 end
  local r = (index + left) * w - now
  if r < 0 then return 0 end
  return r
end

-- From `elapsed` into a window holding `previous` and `current`, the wait until `cost` fits,
-- if nothing else consumes: later in this window as the weight decays, or in the next one.
local function win_wait(previous, current, cost, count, w, elapsed, layout, sliding)
  if sliding and previous > 0 and current + cost <= count then
    local keep = muldiv(count - current - cost, w, previous, false)
    if keep > 0 then
      local wait = (w - keep) - elapsed
      if wait < 0 then wait = 0 end
      return wait
    end
  end
  local into_next = 0
  if sliding and current > 0 then
    local g = granule_of(layout)
    local keep = muldiv(count - cost, w, cdiv(current, g) * g, false)
    if keep > w then keep = w end
    into_next = w - keep
  end
  return (w - elapsed) + into_next
end

-- A call of `cost` on a window counter: allowed, remaining, retry_after, reset_after, and the
-- state to write (index, previous, current; nil when nothing is written).
local function win_decide(index, previous, current, cost, now, count, w, layout, sliding)
  local elapsed, lag
  index, previous, current, elapsed, lag = win_read(index, previous, current, now, w, layout, sliding)
  local used = weigh(previous, elapsed, w, sliding) + current
  if used + cost <= count then
    local after = current + cost
    local reset = win_reset(index, previous, after, now, w, sliding)
    if cost > 0 then
      return 1, count - used - cost, 0, reset, index, previous, after
    end
    return 1, count - used - cost, 0, reset
  end
  local remaining = 0
  if count > used then remaining = count - used end
  local wait = win_wait(previous, current, cost, count, w, elapsed, layout, sliding)
  return 0, remaining, lag + wait, win_reset(index, previous, current, now, w, sliding)
end

-- A record on a window counter: the cost goes into the current count whatever it holds, kept
-- up to twice the count (never lowered); the answer says whether the window is within its
-- limit, and when one unit fits again. Cost 0 is the peek.
local function win_record(index, previous, current, cost, now, count, w, layout, sliding)
  if cost == 0 then return win_decide(index, previous, current, 0, now, count, w, layout, sliding) end
  local elapsed, lag
  index, previous, current, elapsed, lag = win_read(index, previous, current, now, w, layout, sliding)
  local after = current + cost
  if after > 2 * count then after = 2 * count end
  if after < current then after = current end
  local used = weigh(previous, elapsed, w, sliding) + after
  local reset = win_reset(index, previous, after, now, w, sliding)
  if used <= count then return 1, count - used, 0, reset, index, previous, after end
  local wait = win_wait(previous, after, 1, count, w, elapsed, layout, sliding)
  return 0, 0, lag + wait, reset, index, previous, after
end

-- `units` a grant at `granted` took, back to a window counter: off the count of the grant's
-- window if the state still holds it (as the current window, or the previous one of a sliding
-- window), and off nothing else. The state to write, or nil when nothing comes back.
local function win_refund(index, previous, current, units, granted, w, layout, sliding)
  if index == nil or (current == 0 and previous == 0) then return nil end
  local g = fdiv(granted, w)
  if g == index then
    if current == 0 then return nil end
    current = current - units
    if current < 0 then current = 0 end
  elseif sliding and g + 1 == index then
    if previous == 0 then return nil end
    previous = previous - units
    if previous < 0 then previous = 0 end
    local gr = granule_of(layout)
    previous = cdiv(previous, gr) * gr
  else
    return nil
  end
  return index, previous, current
end

------------------------------------------------------------------------------------------------
-- One limit, whatever its algorithm (1 token bucket, 2 sliding, 3 fixed window): a state is
-- (w1, w2, w3), nil for a key never written.

local function decide_one(algo, w1, w2, w3, cost, now, a, b, c, d)
  if algo == 1 then return tb_decide(w1, w2, cost, now, a, b, c, d) end
  return win_decide(w1, w2, w3, cost, now, a, b, c, algo == 2)
end

local function record_one(algo, w1, w2, w3, cost, now, a, b, c, d)
  if algo == 1 then return tb_record(w1, w2, cost, now, a, b, c, d) end
  return win_record(w1, w2, w3, cost, now, a, b, c, algo == 2)
end

-- The refunded state (w1, w2, w3), nil when nothing comes back, or false and an error.
local function refund_one(algo, w1, w2, w3, units, granted, now, a, b, c, d)
  if algo == 1 then
    local n1, n2 = tb_refund(w1, w2, units, now, a, b, d)
    return n1, n2, 0
  end
  return win_refund(w1, w2, w3, units, granted, b, c, algo == 2)
end

-- How much of the limit (algo, a, b, c, d)'s capacity the state has in use at `now`:
-- used, capacity (used is up to twice the capacity: a debt). nil: a state far beyond it.
local function usage(algo, w1, w2, w3, now, a, b, c, d)
  if algo == 1 then
    local debt = tb_debt(w1, w2, now, a, d)
    if debt == nil then return nil end
    return debt, c
  end
  local sliding = algo == 2
  local _, previous, current, elapsed = win_read(w1, w2, w3, now, b, c, sliding)
  return weigh(previous, elapsed, b, sliding) + current, a
end

-- A state with `used` of `capacity` in use at `now`, in the terms of the limit (algo, a, b,
-- c, d): the same fraction, rounded up, a debt carried as debt up to twice the capacity.
local function with_usage(used, capacity, now, algo, a, b, c, d)
  if capacity < 1 then capacity = 1 end
  if used > 2 * capacity then used = 2 * capacity end
  if algo == 1 then
    local debt = muldiv(used, c, capacity, true)
    if debt > 2 * c then debt = 2 * c end
    return now, debt, 0
  end
  local current = muldiv(used, a, capacity, true)
  if current > 2 * a then current = 2 * a end
  return fdiv(now, b), 0, current
end

------------------------------------------------------------------------------------------------
-- States written by earlier versions: a u64 word in decimal, then a space and the tag of the
-- limit that wrote it (`code:a:b:c:d`); a word with no tag is read under the calling limit.

-- A u64 as (hi, lo), each below 2^32.
local function v1_parse(s)
  if not string.find(s, '^%d+$') or #s > 20 then return nil end
  if #s <= 15 then
    local n = tonumber(s)
    local hi = floor(n / TWO32)
    return hi, n - hi * TWO32
  end
  local hi, lo = 0, 0
  for i = 1, #s do
    lo = lo * 10 + (string.byte(s, i) - 48)
    local carry = floor(lo / TWO32)
    lo = lo - carry * TWO32
    hi = hi * 10 + carry
  end
  if hi >= TWO32 then return nil end
  return hi, lo
end

-- (hi, lo) >> k as (hi, lo), 0 <= k < 64.
local function v1_shr(hi, lo, k)
  if k == 0 then return hi, lo end
  if k >= 32 then return 0, floor(hi / 2 ^ (k - 32)) end
  local p = 2 ^ k
  return floor(hi / p), floor(lo / p) + (hi % p) * 2 ^ (32 - k)
end

-- (hi, lo) mod 2^k as a plain number, k <= 52.
local function v1_low(hi, lo, k)
  if k <= 32 then return lo % (2 ^ k) end
  return (hi % (2 ^ (k - 32))) * TWO32 + lo
end

-- An old word in today's terms for the limit that wrote it (algo, a, b, c, d): w1, w2, w3.
local function v1_state(hi, lo, now, algo, a, b, c, d)
  if algo == 1 then
    -- the tat in ticks, as (hi, lo): owed at now is tat - tick(now)
    local nh, nl
    if d > 0 then
      local t = floor(now / 2 ^ d)
      nh = floor(t / TWO32); nl = t - nh * TWO32
    else
      local h = floor(now / TWO32)
      local l = (now - h * TWO32) * a
      local carry = floor(l / TWO32)
      nh, nl = h * a + carry, l - carry * TWO32
    end
    local debt = 0
    if hi > nh or (hi == nh and lo > nl) then debt = (hi - nh) * TWO32 + (lo - nl) end
    if debt >= LIMIT then return nil end
    return now, debt, 0
  end
  local cbits = c % 64
  local pbits = floor(c / 64) % 64
  local ih, il = v1_shr(hi, lo, cbits + pbits)
  if ih >= 1048576 then return nil end
  local index = ih * TWO32 + il
  local previous = 0
  if pbits > 0 then
    local ph, pl = v1_shr(hi, lo, cbits)
    previous = v1_low(ph, pl, pbits) * granule_of(c)
  end
  local current = v1_low(hi, lo, cbits)
  if d >= 64 then
    -- a wrapping window number: the window nearest now with the index's low bits
    local m = 2 ^ (d % 64)
    local near = fdiv(now, b)
    local behind = (near - index) % m
    if behind < m / 2 then index = near - behind else index = near + (m - behind) end
  end
  return index, previous, current
end

------------------------------------------------------------------------------------------------
-- Loading and storing states.

local BAD = 'not a limiter state; delete it or change the prefix'

-- Whether `x` is a whole number in [0, 2^52) (false for NaN).
local function whole(x)
  return x >= 0 and x < LIMIT and x == floor(x)
end

-- The state at `name`, in the terms of the limit that wrote it: w1, w2, w3, then that
-- limit: its algorithm, a, b, c, d and its fields as sent (`params`: 40 bytes; nil for an old
-- state's tag); nothing for a key never written; or false and an error. An old state's limit
-- is its tag's, or the calling limit's (`algo`, a, b, c, d, `params`) when it has none.
local function load(name, now, algo, a, b, c, d, params)
  local raw = redis.pcall('GET', name)
  if not raw then return end
  if type(raw) == 'table' then
    return false, 'key ' .. name .. ' cannot be read (' .. tostring(raw.err) .. '); delete it or change the prefix'
  end
  if #raw == 64 then
    local first = string.byte(raw, 1)
    -- A state's first byte is 0 or that of a double of at least 1; an old state's a digit.
    if first < 48 or first > 57 then
      local w1, w2, w3 = unpack('>ddd', raw)
      local written = string.sub(raw, 25)
      -- Written under the calling limit: the common case, and the script's own bytes.
      if written == params then return w1, w2, w3, algo, a, b, c, d, params end
      local salgo, sa, sb, sc, sd = unpack('>ddddd', raw, 25)
      if (salgo == 1 or salgo == 2 or salgo == 3) and whole(w1) and whole(w2) and whole(w3)
        and whole(sa) and whole(sb) and whole(sc) and whole(sd) and sa >= 1 and sb >= 1 then
        return w1, w2, w3, salgo, sa, sb, sc, sd, written
      end
      return false, 'key ' .. name .. ' holds 64 bytes that are ' .. BAD
    end
  end
  local word, tag = string.match(raw, '^(%d+) ([%d:]+)$')
  if word == nil then word = raw end
  local hi, lo = v1_parse(word)
  if hi == nil then return false, 'key ' .. name .. ' holds "' .. string.sub(raw, 1, 40) .. '", ' .. BAD end
  if tag ~= nil then
    local f = {}
    for field in string.gmatch(tag, '%d+') do f[#f + 1] = tonumber(field) end
    if #f ~= 5 then return false, 'key ' .. name .. ' holds the tag "' .. tag .. '", ' .. BAD end
    algo, a, b, c, d, params = f[1], f[2], f[3], f[4], f[5], nil
  end
  if algo ~= 1 and algo ~= 2 and algo ~= 3 then return false, 'key ' .. name .. ' holds the tag of an unknown algorithm; ' .. BAD end
  local w1, w2, w3 = v1_state(hi, lo, now, algo, a, b, c, d)
  if w1 == nil then return false, 'key ' .. name .. ' ' .. FAR end
  return w1, w2, w3, algo, a, b, c, d, params
end

-- Writes a state under the limit whose fields are `params`; the key expires when the state
-- is full again: `reset_us` rounded up to ms, plus the slack.
local function store(name, w1, w2, w3, params, reset_us, slack)
  local ttl = cdiv(reset_us, 1000) + slack
  if ttl < 1 then ttl = 1 elseif ttl > LIMIT then ttl = LIMIT end -- written as digits below 2^53
  redis.call('SET', name, pack('>ddd', w1, w2, w3) .. params, 'PX', ttl)
end

------------------------------------------------------------------------------------------------
-- A call.

local LIMIT_SIZE = 48 -- six doubles
local LEASE_LIMIT_SIZE = 64 -- eight doubles

-- The limit at `pos` in the call: KEYS index, algorithm, a, b, c, d, and its fields as sent.
local function limit_at(blob, pos)
  local k, algo, a, b, c, d = unpack('>dddddd', blob, pos)
  return k, algo, a, b, c, d, string.sub(blob, pos + 8, pos + 47)
end

-- The state of KEYS[k] for the limit (algo, a, b, c, d, params), rescaled when another limit
-- wrote it: w1, w2, w3 (nil w1: fresh), and whether it was rescaled (changed); or false and an
-- error. `states` (may be nil) holds what this call left at each key, for a batch that names
-- a key twice.
local function state_of(keys, states, k, now, algo, a, b, c, d, params)
  local name = keys[k]
  local s = states and states[name]
  local w1, w2, w3, salgo, sa, sb, sc, sd, sparams
  if s ~= nil then
    w1, w2, w3, salgo, sa, sb, sc, sd, sparams = s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9]
  else
    w1, w2, w3, salgo, sa, sb, sc, sd, sparams = load(name, now, algo, a, b, c, d, params)
    if w1 == false then return false, w2 end
  end
  if w1 == nil or sparams == params
    or (salgo == algo and sa == a and sb == b and sc == c and sd == d) then
    return w1, w2, w3, false
  end
  local used, capacity = usage(salgo, w1, w2, w3, now, sa, sb, sc, sd)
  if used == nil then return false, 'key ' .. name .. ' ' .. FAR end
  w1, w2, w3 = with_usage(used, capacity, now, algo, a, b, c, d)
  return w1, w2, w3, true
end

-- A write: the key's index, the state, the limit (fields as sent, then algorithm and a to d)
-- and when the state is full again.
local function write_of(k, w1, w2, w3, params, reset, algo, a, b, c, d)
  return { k, w1, w2, w3 or 0, params, reset, algo, a, b, c, d }
end

local function apply(keys, wr, slack)
  store(keys[wr[1]], wr[2], wr[3], wr[4], wr[5], wr[6], slack)
end

-- What `states` keeps of a write: the state and the limit that wrote it.
local function kept(wr)
  return { wr[2], wr[3], wr[4], wr[7], wr[8], wr[9], wr[10], wr[11], wr[5] }
end

-- One group of modes 0 and 1 at `pos` in the call: admitted (0/1), its answers (packed), and
-- its writes (nil when none); or nil and an error. Given `slack` (no batch to wait for and no
-- later group to read this one's states), a one-limit group writes at once instead.
local function decide_group(keys, states, blob, pos, cost, n, record, now, slack)
  local admitted = 1
  local answers = ''
  local writes = nil
  for i = 1, n do
    local k, algo, a, b, c, d, params = limit_at(blob, pos)
    pos = pos + LIMIT_SIZE
    if keys[k] == nil or (algo ~= 1 and algo ~= 2 and algo ~= 3) then
      return nil, 'limit ' .. i .. ' of the call is malformed'
    end
    local w1, w2, w3 = state_of(keys, states, k, now, algo, a, b, c, d, params)
    if w1 == false then return nil, w2 end
    local allowed, remaining, retry, reset, n1, n2, n3
    if record then
      allowed, remaining, retry, reset, n1, n2, n3 = record_one(algo, w1, w2, w3, cost, now, a, b, c, d)
    else
      allowed, remaining, retry, reset, n1, n2, n3 = decide_one(algo, w1, w2, w3, cost, now, a, b, c, d)
    end
    if allowed == nil then return nil, 'key ' .. keys[k] .. ': ' .. remaining end
    if allowed == 0 then admitted = 0 end
    if n1 ~= nil then
      if slack ~= nil and n == 1 then
        store(keys[k], n1, n2, n3 or 0, params, reset, slack)
      else
        if writes == nil then writes = {} end
        writes[#writes + 1] = write_of(k, n1, n2, n3, params, reset, algo, a, b, c, d)
      end
    end
    if n == 1 then return admitted, pack('>dddd', allowed, remaining, retry, reset), writes end
    answers = answers .. pack('>dddd', allowed, remaining, retry, reset)
  end
  return admitted, answers, writes
end

-- A group's part of the reply: its answer, or the reason the script refused it alone.
local function refused(why)
  local msg = 'limiter: ' .. why
  return pack('>dd', 2, #msg) .. msg
end

-- Mode 2, refunds: `units` (taken at `granted`) back to every limit of the group, all or none;
-- it answers as a peek after the refund. A key whose limit changed since the grant gives
-- nothing back (its units were rescaled away from the grant).
local function refund_group(keys, blob, pos, units, granted, n, now, slack)
  local answers, writes = '', {}
  for i = 1, n do
    local k, algo, a, b, c, d, params = limit_at(blob, pos)
    pos = pos + LIMIT_SIZE
    if keys[k] == nil or (algo ~= 1 and algo ~= 2 and algo ~= 3) then
      return nil, 'limit ' .. i .. ' of the refund is malformed'
    end
    local w1, w2, w3, changed = state_of(keys, nil, k, now, algo, a, b, c, d, params)
    if w1 == false then return nil, w2 end
    local back = false
    if not changed then
      local n1, n2, n3 = refund_one(algo, w1, w2, w3, units, granted, now, a, b, c, d)
      if n1 == false then return nil, 'key ' .. keys[k] .. ': ' .. n2 end
      if n1 ~= nil then w1, w2, w3, back = n1, n2, n3, true end
    end
    local allowed, remaining, retry, reset = decide_one(algo, w1, w2, w3, 0, now, a, b, c, d)
    if allowed == nil then return nil, 'key ' .. keys[k] .. ': ' .. remaining end
    if back then writes[#writes + 1] = write_of(k, w1, w2, w3, params, reset) end
    answers = answers .. pack('>dddd', allowed, remaining, retry, reset)
  end
  for _, wr in ipairs(writes) do apply(keys, wr, slack) end
  return pack('>d', 1) .. answers
end

-- Mode 3, leases. A node holding a lease decides locally against units it took from the
-- state ahead of time; each limit's ledger (a hash: holder -> "units deadline_us granted_us")
-- records the leases outstanding, so that they never add up to more than the limit's slack.
-- A group: returns the `returned` units of the holder's live lease (never more than the
-- ledger says it holds; nothing once the lease expired or the limit changed), ends that lease,
-- then takes `cost` units for the caller and up to `want` more as a new lease of `ttl_ms`
-- (renewing ahead, the holder instead keeps up to `kept` units of its live lease, no more than
-- the ledger says it holds, and they count in the new lease, which takes that much less):
-- no more than the state holds beyond the cost, and on each limit no more than an equal share
-- of what the slack leaves once the other live leases are counted: (slack - held) / (holders
-- + 1). A holder that asked for a lease is recorded even when it got none, so the others'
-- next shares make room for it. Nothing is taken unless every limit holds the cost (then the
-- answers are the denial); a want of 0 takes no lease and leaves the ledger. Expired leases
-- leave the ledger (their units are lost, never returned: the holder may have spent them); an
-- entry no lease wrote fails the call with the key named, and is left as found.
local function lease_group(keys, blob, pos, head, holder, now, slack)
  local cost, want, returned, kept, ttl, n = head[1], head[2], head[3], head[4], head[5], head[6]
  local limits = {}
  local lease = want
  local least_free = nil
  for i = 1, n do
    local k, algo, a, b, c, d, params = limit_at(blob, pos)
    local ledger, share = unpack('>dd', blob, pos + LIMIT_SIZE)
    pos = pos + LEASE_LIMIT_SIZE
    if keys[k] == nil or keys[ledger] == nil or share < 0 or (algo ~= 1 and algo ~= 2 and algo ~= 3) then
      return nil, 'limit ' .. i .. ' of the lease is malformed'
    end
    local entries = redis.pcall('HGETALL', keys[ledger])
    if type(entries) == 'table' and entries.err then
      return nil, 'key ' .. keys[ledger] .. ' is not a lease ledger (' .. entries.err .. '); delete it or change the prefix'
    end
    local held, holders, mine = 0, 0, nil
    for j = 1, #entries, 2 do
      local units, deadline, granted = string.match(entries[j + 1], '^(%d+) (%d+) (%d+)$')
      units, deadline, granted = tonumber(units), tonumber(deadline), tonumber(granted)
      if units == nil then
        -- Not what a lease writes (another program's field, a hand-made entry): refused,
        -- as a state no limiter wrote is, and left for whoever wrote it.
        return nil, 'key ' .. keys[ledger] .. ' holds an entry "' .. string.sub(entries[j], 1, 40) .. '" = "' .. string.sub(entries[j + 1], 1, 40) .. '" no lease wrote; delete it or change the prefix'
      elseif deadline <= now then
        redis.call('HDEL', keys[ledger], entries[j])
      elseif entries[j] == holder then
        mine = { units, granted }
        if units < kept then kept = units end
      else
        held = held + units
        holders = holders + 1
      end
    end
    local w1, w2, w3, changed = state_of(keys, nil, k, now, algo, a, b, c, d, params)
    if w1 == false then return nil, w2 end
    local dirty = changed
    if mine ~= nil and returned > 0 and not changed then
      local units = returned
      if units > mine[1] then units = mine[1] end
      local n1, n2, n3 = refund_one(algo, w1, w2, w3, units, mine[2], now, a, b, c, d)
      if n1 == false then return nil, 'key ' .. keys[k] .. ': ' .. n2 end
      if n1 ~= nil then w1, w2, w3, dirty = n1, n2, n3, true end
    end
    local allowed, remaining, _, reset = decide_one(algo, w1, w2, w3, 0, now, a, b, c, d)
    if allowed == nil then return nil, 'key ' .. keys[k] .. ': ' .. remaining end
    local room = remaining - cost
    if room < lease then lease = room end
    local free = share - held
    if free < 0 then free = 0 end
    free = fdiv(free, holders + 1)
    if free < lease then lease = free end
    if least_free == nil or free < least_free then least_free = free end
    if mine == nil then kept = 0 end
    limits[i] = { k = k, algo = algo, a = a, b = b, c = c, d = d, params = params, w1 = w1,
      w2 = w2, w3 = w3, dirty = dirty, ledger = keys[ledger], reset = reset, mine = mine }
  end
  -- What is kept counts in the holder's share: the new lease takes that much less.
  if least_free ~= nil and lease > least_free - kept then lease = least_free - kept end
  if lease < 0 then lease = 0 end
  -- Decides every limit at `take`: its answers and writes; nil when one does not admit it.
  local function take_all(take)
    local parts, writes = {}, {}
    for i, l in ipairs(limits) do
      local allowed, remaining, retry, reset, n1, n2, n3 = decide_one(l.algo, l.w1, l.w2, l.w3, take, now, l.a, l.b, l.c, l.d)
      if allowed == nil then return nil, 'key ' .. keys[l.k] .. ': ' .. remaining end
      if allowed == 0 then return nil end
      parts[i] = pack('>dddd', allowed, remaining, retry, reset)
      if n1 ~= nil then
        writes[i] = write_of(l.k, n1, n2, n3, l.params, reset)
      elseif l.dirty then
        writes[i] = write_of(l.k, l.w1, l.w2, l.w3, l.params, reset)
      end
    end
    return parts, writes
  end
  local parts, writes = take_all(cost + lease)
  if parts == nil and writes ~= nil then return nil, writes end
  if parts == nil and lease > 0 then
    -- a window's remaining count can be rounded: the cost alone may still fit
    lease = 0
    parts, writes = take_all(cost)
    if parts == nil and writes ~= nil then return nil, writes end
  end
  local admitted = 1
  if parts == nil then
    -- Denied: nothing is taken; the answers say when the cost fits. A returned lease still
    -- comes back.
    admitted, lease = 0, 0
    parts, writes = {}, {}
    for i, l in ipairs(limits) do
      local allowed, remaining, retry, reset = decide_one(l.algo, l.w1, l.w2, l.w3, cost, now, l.a, l.b, l.c, l.d)
      if allowed == nil then return nil, 'key ' .. keys[l.k] .. ': ' .. remaining end
      parts[i] = pack('>dddd', allowed, remaining, retry, reset)
      if l.dirty then writes[i] = write_of(l.k, l.w1, l.w2, l.w3, l.params, l.reset) end
    end
  end
  for i, l in ipairs(limits) do
    local wr = writes[i]
    if wr ~= nil then apply(keys, wr, slack) end
    if want > 0 then
      -- Recorded even with nothing leased, so the other holders' shares make room for it.
      -- Units kept were granted earlier: a refund of any of them is made at that instant.
      local granted = now
      if kept > 0 then granted = l.mine[2] end
      redis.call('HSET', l.ledger, holder, string.format('%.0f %.0f %.0f', lease + kept, now + ttl * 1000, granted))
      local left = redis.call('PTTL', l.ledger)
      if left < ttl then redis.call('PEXPIRE', l.ledger, ttl + slack) end
    else
      redis.call('HDEL', l.ledger, holder)
    end
  end
  return pack('>ddd', admitted, lease, kept) .. table.concat(parts)
end

local function fail(msg)
  return redis.error_reply('limiter: ' .. msg)
end

-- Mode 1 after a blocked batch: only the records are written, recorded again in order on the
-- state as read (`before`, what the batch found at each key it wrote); admitted groups then
-- report the state the batch leaves. `heads` holds each group's head and result.
local function unwind(keys, blob, heads, before, states, now, slack)
  local read = {}
  for name, state in pairs(before) do
    if state[1] ~= nil then read[name] = state end
  end
  for name, state in pairs(states) do
    if before[name] == nil then read[name] = state end
  end
  for _, head in ipairs(heads) do
    if head[4] and head[6] ~= nil then
      local admitted, answers, writes = decide_group(keys, read, blob, head[3], head[1], head[2], true, now)
      if admitted ~= nil then
        head[5] = pack('>d', admitted) .. answers
        for _, wr in ipairs(writes or {}) do
          read[keys[wr[1]]] = kept(wr)
          apply(keys, wr, slack)
        end
      end
    end
  end
  for _, head in ipairs(heads) do
    if not head[4] and head[6] == 1 then
      local admitted, answers = decide_group(keys, read, blob, head[3], 0, head[2], false, now)
      if admitted ~= nil then head[5] = pack('>d', 1) .. answers end
    end
  end
end

-- The entry point: `keys` and `args` as FCALL (or EVALSHA) passes them.
local function decide(keys, args)
  if floor == nil then floor, pack, unpack = math.floor, struct.pack, struct.unpack end
  local blob = args[1]
  if type(blob) ~= 'string' or #blob < 40 then return fail('ARGV[1] must hold the call') end
  local now, slack, groups, mode, distinct = unpack('>ddddd', blob)
  if now < 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  if now ~= floor(now) then return fail('now_us must be a whole number of microseconds') end
  if now >= LIMIT then return fail('the time ' .. string.format('%.0f', now) .. ' us is past 2^52 us (year 2112)') end
  local pos = 41
  local reply = { pack('>d', now) }

  if mode == 2 then
    for g = 1, groups do
      local units, granted, n = unpack('>ddd', blob, pos)
      pos = pos + 24
      if granted < 0 then granted = now end
      local answer, err = refund_group(keys, blob, pos, units, granted, n, now, slack)
      pos = pos + n * LIMIT_SIZE
      reply[g + 1] = answer or refused(err)
    end
    return table.concat(reply)
  end

  if mode == 3 then
    local holder = args[2]
    if type(holder) ~= 'string' then return fail('a lease call names its holder in ARGV[2]') end
    for g = 1, groups do
      local cost, want, returned, kept, ttl, n = unpack('>dddddd', blob, pos)
      pos = pos + 48
      if ttl < 1 then return fail('a lease header is malformed') end
      local answer, err = lease_group(keys, blob, pos, { cost, want, returned, kept, ttl, n }, holder, now, slack)
      pos = pos + n * LEASE_LIMIT_SIZE
      reply[g + 1] = answer or refused(err)
    end
    return table.concat(reply)
  end

  if mode ~= 0 and mode ~= 1 then return fail('the mode must be 0, 1, 2 or 3') end
  local batch = mode == 1
  -- key name -> the state this call left there (needed only when groups may share keys)
  local states = nil
  if batch or (groups > 1 and distinct ~= 1) then states = {} end
  local direct = nil -- groups write as they are decided
  if states == nil then direct = slack end
  local before, heads, pending -- mode 1: the states as read, each group's head, the writes
  if batch then before, heads, pending = {}, {}, {} end
  local blocked = false
  for g = 1, groups do
    local cost, kind, n = unpack('>ddd', blob, pos)
    pos = pos + 24
    local record = kind == 2
    local admitted, answers, writes = decide_group(keys, states, blob, pos, cost, n, record, now, direct)
    local result
    if admitted == nil then
      result = refused(answers)
      if kind == 1 then blocked = true end
    else
      result = pack('>d', admitted) .. answers
      if writes ~= nil and (admitted == 1 or record) then
        for _, wr in ipairs(writes) do
          local name = keys[wr[1]]
          if batch and before[name] == nil then
            local old = states[name]
            if old == nil then
              old = { load(name, now, wr[7], wr[8], wr[9], wr[10], wr[11], wr[5]) }
              if old[1] == false then old = {} end
            end
            before[name] = old
          end
          if states ~= nil then states[name] = kept(wr) end
          if batch then pending[#pending + 1] = wr else apply(keys, wr, slack) end
        end
      elseif admitted == 0 and kind == 1 then
        blocked = true
      end
    end
    if batch then heads[g] = { cost, n, pos, record, result, admitted } end
    reply[g + 1] = result
    pos = pos + n * LIMIT_SIZE
  end
  if batch then
    if blocked then
      unwind(keys, blob, heads, before, states or {}, now, slack)
      for g = 1, groups do reply[g + 1] = heads[g][5] end
    else
      for _, wr in ipairs(pending) do apply(keys, wr, slack) end
    end
  end
  return table.concat(reply)
end

-- A cluster node's coalesced decisions, whose keys are in several of its slots: KEYS is empty
-- (Redis refuses declared keys of several slots) and the keys follow the call and the holder
-- in ARGV[3], ARGV[4], ...; registered with the flag allow-cross-slot-keys. A key this node
-- does not serve (its slot moved) cannot be read, so its group alone is refused ("Script
-- attempted to access a non local key") and the caller sends it again on its own.
local function decide_node(_, args)
  local keys = {}
  for i = 3, #args do keys[i - 2] = args[i] end
  return decide(keys, args)
end
