-- limiter-redis: every algorithm's pure transition, decided for a whole call in one script.
--
-- The same arithmetic as the Rust algorithms (limiter-token-bucket's Gcra, limiter-sliding-
-- window's WindowCounter), with time in microseconds since the Unix epoch. Each key holds the
-- same u64 state word as the Rust algorithm, in decimal, then a space and the tag of the limit
-- that wrote it (`algorithm:a:b:c:d`, its fields as sent). A call under another limit (the
-- caller changed it) first rescales the word: the same fraction of the limit's capacity stays
-- in use, rounded up, as the Rust algorithms' `usage` and `with_usage` do; a word with no tag is
-- read under the calling limit. Lua numbers are doubles, so a word is
-- handled as two 32-bit halves; every other quantity stays below 2^53: the Rust side keeps a
-- token bucket's depth tau below 2^52 ticks, and products of a count and a window, which can
-- reach 2^78, are computed exactly by muldiv below.
--
-- ARGV: now_us ("" reads the server's TIME), the expiry slack in ms (kept on top of the time
-- until a state is full again), the number of groups, the batch mode (0: each group on its
-- own; 1: all or nothing, see below), then for each group:
--   cost, kind (1 enforced; 0 a shadow group, which never blocks a batch; 2 a record of usage
--   that already happened, written whatever it finds and never blocking a batch: a state may
--   go into debt, up to twice its capacity in use), number of limits,
--   and per limit six fields: KEYS index, algorithm, a, b, c, d
--   algorithm 1 (token bucket): a = q ticks per us, b = p ticks per unit, c = tau (= burst * p),
--     d = s: a tick is 2^s / q us (q is 1 when s > 0; readings are then floored to a tick)
--   algorithm 2 (sliding window) / 3 (fixed window): a = count, b = window us,
--     c = current bits + 64 * previous bits + 4096 * granule bits (the previous count is kept in
--     units of 2^granule, rounded up), d = index bits + 64 * wrapping (the window number is kept
--     modulo 2^index bits, read as the window nearest now with the same low bits)
-- Mode 2 gives units back instead (refunds): each group is `units, granted_us, n` and n limits
-- (`granted_us` may be `now`: units given back without a grant), and answers as a peek after
-- its refund (see `refund_group`).
-- Mode 3 leases (see `lease_group`): each group is `cost, want, returned, holder, ttl_ms, n`
-- and per limit eight fields: the six above, then the KEYS index of the limit's lease ledger
-- and the limit's slack in units. Its reply carries the units leased after the admitted flag.
-- A group is all or nothing: its writes happen only if every limit admits (a record's always
-- happen; its admitted flag says whether every limit is still within its limit). Groups are
-- decided in order, each on the state the earlier ones left. In mode 1 the batch is all or
-- nothing as well: the writes wait until every group is decided and happen only if every
-- enforced group admitted; otherwise only the records are written (recorded again, in order,
-- on the state as read), and each admitted group is decided again with cost 0 on that state,
-- so it reports what it holds after the batch (as a refunded batch does in process).
-- Reply: now_us, then per group: admitted (0/1), or an error message for that group alone
-- (which then writes nothing and has no more entries), then per limit: allowed (0/1), remaining,
-- retry_after_us, reset_after_us. A value of 2^53 or more is sent as a decimal string.

local TWO32 = 4294967296
local LIMIT = 4503599627370496 -- 2^52: every plain number stays below it

local function fail(msg)
  return redis.error_reply('limiter: ' .. msg)
end

-- floor(a / b) and ceil(a / b), exact for 0 <= a, b < 2^52.
local function fdiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1 elseif r >= b then q = q + 1 end
  return q
end
local function cdiv(a, b)
  local q = fdiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- A u64 as (hi, lo), each below 2^32.
local function parse(s)
  if not string.find(s, '^%d+$') or #s > 20 then return nil end
  if #s <= 15 then
    local n = tonumber(s)
    local hi = math.floor(n / TWO32)
    return hi, n - hi * TWO32
  end
  local hi, lo = 0, 0
  for i = 1, #s do
    lo = lo * 10 + (string.byte(s, i) - 48)
    local carry = math.floor(lo / TWO32)
    lo = lo - carry * TWO32
    hi = hi * 10 + carry
  end
  if hi >= TWO32 then return nil end
  return hi, lo
end

local function format(hi, lo)
  if hi < 1048576 then return string.format('%.0f', hi * TWO32 + lo) end
  local groups = {}
  while hi >= 1048576 do
    local hq = math.floor(hi / 10000)
    local t = (hi - hq * 10000) * TWO32 + lo
    local q = math.floor(t / 10000)
    table.insert(groups, 1, string.format('%04d', t - q * 10000))
    hi, lo = hq, q
  end
  return string.format('%.0f', hi * TWO32 + lo) .. table.concat(groups)
end

-- (hi, lo) from a plain integer below 2^64 held exactly in a double.
local function split(x)
  local hi = math.floor(x / TWO32)
  return hi, x - hi * TWO32
end

local function add(ah, al, b) -- (ah, al) + b, b < 2^52
  local bh, bl = split(b)
  local lo = al + bl
  local carry = 0
  if lo >= TWO32 then lo = lo - TWO32; carry = 1 end
  return ah + bh + carry, lo
end

local function out(x)
  if x >= 9007199254740992 then return string.format('%.0f', x) end
  return x
end

-- (hi, lo) >> k as (hi, lo), 0 <= k < 64.
local function shr(hi, lo, k)
  if k == 0 then return hi, lo end
  if k >= 32 then return 0, math.floor(hi / 2 ^ (k - 32)) end
  local p = 2 ^ k
  return math.floor(hi / p), math.floor(lo / p) + (hi % p) * 2 ^ (32 - k)
end

-- (hi, lo) << k as (hi, lo), for a value that still fits 64 bits.
local function shl(hi, lo, k)
  if k == 0 then return hi, lo end
  if k >= 32 then return lo * 2 ^ (k - 32), 0 end
  local p = 2 ^ k
  local keep = 2 ^ (32 - k)
  return hi * p + math.floor(lo / keep), (lo % keep) * p
end

-- (hi, lo) mod 2^k as a plain number, k <= 52.
local function low_bits(hi, lo, k)
  if k <= 32 then return lo % (2 ^ k) end
  return (hi % (2 ^ (k - 32))) * TWO32 + lo
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
  local a1, b1 = math.floor(a / B), math.floor(b / B)
  local a0, b0 = a - a1 * B, b - b1 * B
  local d = { a0 * b0, a1 * b0 + a0 * b1, a1 * b1, 0 }
  for i = 1, 3 do
    local carry = math.floor(d[i] / B)
    d[i] = d[i] - carry * B
    d[i + 1] = d[i + 1] + carry
  end
  local q, r = 0, 0
  for i = 4, 1, -1 do
    for bit = 25, 0, -1 do
      local digit = math.floor(d[i] / 2 ^ bit) % 2
      r = r * 2 + digit
      q = q * 2
      if r >= c then r = r - c; q = q + 1 end
    end
  end
  if up and r > 0 then q = q + 1 end
  return q
end

-- now in ticks of 2^s / q us, as (hi, lo): now * q (q <= 256, now < 2^52), or floor(now / 2^s)
local function now_ticks(now, q, s)
  if s > 0 then return split(math.floor(now / 2 ^ s)) end
  local nh, nl = split(now)
  nl = nl * q
  local carry = math.floor(nl / TWO32)
  return nh * q + carry, nl - carry * TWO32
end

-- A token bucket's state read at `now`: now in ticks (nh, nl), the debt (max(tat, now) - now,
-- in ticks), and until_tick, the wait from now until the reading at which tick now + ticks is
-- current; or nil and an error.
local function tat_at(hi, lo, now, q, s)
  local nh, nl = now_ticks(now, q, s)
  local function until_tick(ticks)
    if s == 0 then return cdiv(ticks, q) end
    local w = ticks * 2 ^ s + ((nh * TWO32 + nl) * 2 ^ s - now)
    if w < 0 then return 0 end
    return w
  end
  local debt = 0
  if hi > nh or (hi == nh and lo > nl) then
    debt = (hi - nh) * TWO32 + (lo - nl)
    if debt >= LIMIT then return nil, 'holds a tat ' .. format(hi, lo) .. ' far beyond its limit; delete it or change the prefix' end
  end
  return nh, nl, debt, until_tick
end

-- Token bucket (GCRA). The word is the tat in ticks of 2^s / q us; a unit is p ticks.
local function token_bucket(hi, lo, cost, now, q, p, tau, s)
  local burst = tau / p
  if cost > burst then return nil, 'cost ' .. cost .. ' exceeds the burst of ' .. burst .. ', so it can never be admitted' end
  local nh, nl, debt, until_tick = tat_at(hi, lo, now, q, s)
  if nh == nil then return nil, nl end
  local cost_ticks = cost * p
  local budget = tau - cost_ticks
  if debt <= budget then
    local new_debt = debt + cost_ticks
    local nxh, nxl = nil, nil
    if cost > 0 then nxh, nxl = add(nh, nl, new_debt) end
    return { 1, fdiv(tau - new_debt, p), 0, until_tick(new_debt) }, nil, nxh, nxl
  end
  local headroom = 0
  if tau > debt then headroom = tau - debt end
  return { 0, fdiv(headroom, p), until_tick(debt - budget), until_tick(debt) }
end

-- A record on a token bucket: the tat moves ahead by the cost whatever it finds, at most
-- 2 * tau ahead of now (never back); the answer says whether the bucket is within its limit,
-- and when one unit fits again. Cost 0 is the peek.
local function token_record(hi, lo, cost, now, q, p, tau, s)
  if cost == 0 then return token_bucket(hi, lo, 0, now, q, p, tau, s) end
  local nh, nl, debt, until_tick = tat_at(hi, lo, now, q, s)
  if nh == nil then return nil, nl end
  local new_debt = debt
  local room = 2 * tau - debt
  if room > 0 then
    -- cost < room / p exactly when cost * p < room (cost is a whole number)
    if cost < room / p then new_debt = debt + cost * p else new_debt = 2 * tau end
  end
  local nxh, nxl = add(nh, nl, new_debt)
  if new_debt <= tau then
    return { 1, fdiv(tau - new_debt, p), 0, until_tick(new_debt) }, nil, nxh, nxl
  end
  return { 0, 0, until_tick(new_debt - (tau - p)), until_tick(new_debt) }, nil, nxh, nxl
end

-- Window counters. The word is [window index | previous count / 2^g (sliding) | current count].

-- The fields of a window word: index (absolute, not yet resolved when wrapping), current,
-- previous (in units), or nil and an error.
local function unpack_window(hi, lo, layout)
  local cbits = layout % 64
  local pbits = math.floor(layout / 64) % 64
  local granule = 2 ^ math.floor(layout / 4096)
  local ih, il = shr(hi, lo, cbits + pbits)
  if ih >= 1048576 then return nil, 'holds a window index far beyond its limit; delete it or change the prefix' end
  local previous = 0
  if pbits > 0 then
    local ph, pl = shr(hi, lo, cbits)
    previous = low_bits(ph, pl, pbits) * granule
  end
  return ih * TWO32 + il, low_bits(hi, lo, cbits), previous
end

-- The window word for absolute window `index` with `previous` (a multiple of the granule) and
-- `current` units, as (hi, lo).
local function pack(index, previous, current, layout, indexing)
  local cbits = layout % 64
  local pbits = math.floor(layout / 64) % 64
  local granule = 2 ^ math.floor(layout / 4096)
  local stored = index
  if indexing >= 64 then stored = index % 2 ^ (indexing % 64) end
  local sh, sl = split(stored)
  sh, sl = shl(sh, sl, cbits + pbits)
  local ph, pl = split(previous / granule)
  ph, pl = shl(ph, pl, cbits)
  local ch, cl = split(current)
  -- the fields do not overlap: their halves add without carries
  return sh + ph + ch, sl + pl + cl
end

-- The absolute window of a wrapping index: the one nearest `near` with the same low bits.
local function nearest(index, near, indexing)
  if indexing < 64 then return index end
  local m = 2 ^ (indexing % 64)
  local behind = (near - index) % m
  if behind < m / 2 then return near - behind end
  return near + (m - behind)
end

-- A window state as read at `now`: the window it is in (a reading before the state's own
-- window is taken at that window's start), the previous (a multiple of the granule) and
-- current counts there, how far into it the reading is, and the lag (how far the reading is
-- behind that window's start); or nil and an error.
local function read_window(hi, lo, now, w, layout, indexing, sliding)
  local gbits = math.floor(layout / 4096)
  local index, current, previous = unpack_window(hi, lo, layout)
  if index == nil then return nil, current end
  local win = fdiv(now, w)
  -- the window nearest now with the index's low bits
  index = nearest(index, win, indexing)
  -- an empty state is fresh, whatever its index
  if current == 0 and previous == 0 and index > win then index = win end
  if index * w >= LIMIT then return nil, 'holds a window index far beyond its limit; delete it or change the prefix' end
  local at = now
  if win < index then at = index * w else
    local gap = win - index
    if gap == 1 and sliding then
      previous, current = current, 0
      if gbits > 0 then previous = cdiv(previous, 2 ^ gbits) * 2 ^ gbits end
    elseif gap >= 1 then previous, current = 0, 0 end
    index = win
  end
  return index, previous, current, at - index * w, at - now
end

-- The previous window's count weighted by its overlap with the sliding window, rounded up.
local function weigh(previous, elapsed, w, sliding)
  if sliding and previous > 0 then return muldiv(previous, w - elapsed, w, true) end
  return 0
end

-- From `now`, the wait until the counts (`previous`, `current` in window `index`) are empty.
local function window_reset(index, previous, current, now, w, sliding)
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
local function window_wait(previous, current, cost, count, w, elapsed, layout, sliding)
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
    local granule = 2 ^ math.floor(layout / 4096)
    local keep = muldiv(count - cost, w, cdiv(current, granule) * granule, false)
    if keep > w then keep = w end
    into_next = w - keep
  end
  return (w - elapsed) + into_next
end

local function window(hi, lo, cost, now, count, w, layout, indexing, sliding)
  if cost > count then return nil, 'cost ' .. cost .. ' exceeds the burst of ' .. count .. ', so it can never be admitted' end
  local index, previous, current, elapsed, lag = read_window(hi, lo, now, w, layout, indexing, sliding)
  if index == nil then return nil, previous end
  local used = weigh(previous, elapsed, w, sliding) + current
  if used + cost <= count then
    local after = current + cost
    local nxh, nxl = nil, nil
    if cost > 0 then
      nxh, nxl = pack(index, previous, after, layout, indexing)
    end
    return { 1, count - used - cost, 0, window_reset(index, previous, after, now, w, sliding) }, nil, nxh, nxl
  end
  local remaining = 0
  if count > used then remaining = count - used end
  local wait = window_wait(previous, current, cost, count, w, elapsed, layout, sliding)
  return { 0, remaining, lag + wait, window_reset(index, previous, current, now, w, sliding) }
end

-- A record on a window counter: the cost goes into the current window's count whatever it
-- holds, kept up to twice the count (never lowered); the answer says whether the window is
-- within its limit, and when one unit fits again. Cost 0 is the peek.
local function window_record(hi, lo, cost, now, count, w, layout, indexing, sliding)
  if cost == 0 then return window(hi, lo, 0, now, count, w, layout, indexing, sliding) end
  local index, previous, current, elapsed, lag = read_window(hi, lo, now, w, layout, indexing, sliding)
  if index == nil then return nil, previous end
  local after = current + cost
  if after > 2 * count then after = 2 * count end
  if after < current then after = current end
  local nxh, nxl = pack(index, previous, after, layout, indexing)
  local used = weigh(previous, elapsed, w, sliding) + after
  local reset = window_reset(index, previous, after, now, w, sliding)
  if used <= count then return { 1, count - used, 0, reset }, nil, nxh, nxl end
  local wait = window_wait(previous, after, 1, count, w, elapsed, layout, sliding)
  return { 0, 0, lag + wait, reset }, nil, nxh, nxl
end

-- Refunds: `units` a grant at `granted` took come back, as the Rust algorithms' `refund`
-- does. Each returns the new state as (hi, lo), nil when nothing comes back, or nil and an
-- error.

-- Token bucket: the tat moves back by the units, never before now (never above full).
local function token_refund(hi, lo, units, now, q, p, s)
  local nh, nl = now_ticks(now, q, s)
  if not (hi > nh or (hi == nh and lo > nl)) then return nil end
  local debt = (hi - nh) * TWO32 + (lo - nl)
  if debt >= LIMIT then return nil, 'holds a tat ' .. format(hi, lo) .. ' far beyond its limit; delete it or change the prefix' end
  local left = debt - units * p
  if left < 0 then left = 0 end
  return add(nh, nl, left)
end

-- Windows: the units come off the count of the grant's window if the state still holds it
-- (as the current window, or as the previous one of a sliding window), and off nothing else.
local function window_refund(hi, lo, units, granted, w, layout, indexing, sliding)
  local index, current, previous = unpack_window(hi, lo, layout)
  if index == nil then return nil, current end
  local g = fdiv(granted, w)
  if current == 0 and previous == 0 then return nil end
  index = nearest(index, g, indexing)
  if g == index then
    if current == 0 then return nil end
    current = current - units
    if current < 0 then current = 0 end
  elseif sliding and g + 1 == index then
    if previous == 0 then return nil end
    previous = previous - units
    if previous < 0 then previous = 0 end
    local granule = 2 ^ math.floor(layout / 4096)
    previous = cdiv(previous, granule) * granule
  else
    return nil
  end
  return pack(index, previous, current, layout, indexing)
end

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
  if now == nil or now < 0 or now ~= math.floor(now) then return fail('now_us must be a whole number of microseconds') end
end
if now >= LIMIT then return fail('the time ' .. out(now) .. ' us is past 2^52 us (year 2112)') end

local slack = tonumber(ARGV[2])
local groups = tonumber(ARGV[3])
local mode = tonumber(ARGV[4])
if slack == nil or groups == nil or (mode ~= 0 and mode ~= 1 and mode ~= 2 and mode ~= 3) then
  return fail('ARGV[2..4] must be the expiry slack, the number of groups and the mode (0, 1, 2 or 3)')
end

-- One limit's answer to `cost` units on its state, as `token_bucket` (algorithm 1) or
-- `window` (2 sliding, 3 fixed) gives it; the caller has checked the algorithm.
local function decide_one(algo, hi, lo, cost, now, a, b, c, d)
  if algo == 1 then return token_bucket(hi, lo, cost, now, a, b, c, d) end
  return window(hi, lo, cost, now, a, b, c, d, algo == 2)
end

-- A record of `cost` units on one limit's state, as `token_record` or `window_record` does
-- it; the caller has checked the algorithm.
local function record_one(algo, hi, lo, cost, now, a, b, c, d)
  if algo == 1 then return token_record(hi, lo, cost, now, a, b, c, d) end
  return window_record(hi, lo, cost, now, a, b, c, d, algo == 2)
end

-- `units` a grant at `granted` took, back to one limit's state, as `token_refund` or
-- `window_refund` does it; the caller has checked the algorithm.
local function refund_one(algo, hi, lo, units, granted, now, a, b, c, d)
  if algo == 1 then return token_refund(hi, lo, units, now, a, b, d) end
  return window_refund(hi, lo, units, granted, b, c, d, algo == 2)
end

local states = {} -- key name -> {hi, lo}: the state as this script left it (a batch may
-- name one key at several KEYS indexes)
local before = {} -- key name -> {hi, lo}: the state as read, before any group

-- The state a key holds, as {hi, lo, tag} ({0, 0} when absent; no tag when absent or written
-- without one), or nil and an error.
local function load(name)
  local raw = redis.pcall('GET', name)
  if type(raw) == 'table' and raw.err then
    return nil, 'key ' .. name .. ' cannot be read (' .. raw.err .. '); delete it or change the prefix'
  end
  if not raw then return { 0, 0 } end
  local word, tag = string.match(raw, '^(%d+) ([%d:]+)$')
  if word == nil then word = raw end
  local hi, lo = parse(word)
  if hi == nil then
    return nil, 'key ' .. name .. ' holds "' .. string.sub(raw, 1, 40) .. '", not a limiter state; delete it or change the prefix'
  end
  return { hi, lo, tag }
end

-- The tag of the limit at ARGV[arg] (its algorithm and a..d, as sent).
local function tag_at(arg)
  return ARGV[arg + 1] .. ':' .. ARGV[arg + 2] .. ':' .. ARGV[arg + 3] .. ':' .. ARGV[arg + 4] .. ':' .. ARGV[arg + 5]
end

-- The state (hi, lo), written under the limit `tag`, in terms of the limit (algo, a, b, c, d):
-- the part of the old limit's capacity in use now (its `usage`), as the same fraction of the
-- new one's, rounded up (its `with_usage`): a token bucket's debt, a window's count all in the
-- current window. Returns (hi, lo), or nil and an error.
local function rescale(hi, lo, tag, algo, a, b, c, d)
  local f = {}
  for field in string.gmatch(tag, '%d+') do f[#f + 1] = tonumber(field) end
  if #f ~= 5 then return nil, 'holds the tag "' .. tag .. '", not a limit; delete it or change the prefix' end
  local used, capacity
  if f[1] == 1 then
    local nh, nl = now_ticks(now, f[2], f[5])
    used, capacity = 0, f[4]
    if hi > nh or (hi == nh and lo > nl) then
      used = (hi - nh) * TWO32 + (lo - nl)
    end
  elseif f[1] == 2 or f[1] == 3 then
    local sliding = f[1] == 2
    local index, previous, current, elapsed = read_window(hi, lo, now, f[3], f[4], f[5], sliding)
    if index == nil then return nil, previous end
    used, capacity = weigh(previous, elapsed, f[3], sliding) + current, f[2]
  else
    return nil, 'holds the tag "' .. tag .. '" of an unknown algorithm; delete it or change the prefix'
  end
  if capacity < 1 then capacity = 1 end
  -- a debt carries over, up to twice the capacity in use
  if used > 2 * capacity then used = 2 * capacity end
  if algo == 1 then
    local nh, nl = now_ticks(now, a, d)
    return add(nh, nl, muldiv(used, c, capacity, true))
  end
  return pack(fdiv(now, b), 0, muldiv(used, a, capacity, true), c, d)
end

-- The six fields of the limit at ARGV[arg]: KEYS index, algorithm, a, b, c, d; nil if any
-- is missing or not a number.
local function limit_at(arg)
  local k = tonumber(ARGV[arg])
  local algo = tonumber(ARGV[arg + 1])
  local a, b, c, d = tonumber(ARGV[arg + 2]), tonumber(ARGV[arg + 3]), tonumber(ARGV[arg + 4]), tonumber(ARGV[arg + 5])
  if k == nil or KEYS[k] == nil or algo == nil or a == nil or b == nil or c == nil or d == nil then return nil end
  return k, algo, a, b, c, d
end

-- Decides one group (records it, if `record`); returns its answers and writes, or an error
-- message.
local function decide_group(cost, n, arg, record)
  local admitted = 1
  local writes = {}
  local answers = {}
  for i = 1, n do
    local k, algo, a, b, c, d = limit_at(arg)
    arg = arg + 6
    if k == nil then return nil, 'limit ' .. i .. ' of the call is malformed' end
    local tag = tag_at(arg - 6)
    local state = states[KEYS[k]]
    if state == nil then
      local err
      state, err = load(KEYS[k])
      if state == nil then return nil, err end
      states[KEYS[k]] = state
      before[KEYS[k]] = state
    end
    local hi, lo = state[1], state[2]
    local answer, err, nxh, nxl
    if state[3] ~= nil and state[3] ~= tag and (algo == 1 or algo == 2 or algo == 3) then
      hi, lo = rescale(hi, lo, state[3], algo, a, b, c, d)
      if hi == nil then return nil, 'key ' .. KEYS[k] .. ': ' .. lo end
    end
    if algo ~= 1 and algo ~= 2 and algo ~= 3 then
      return nil, 'unknown algorithm ' .. tostring(algo)
    end
    if record then
      answer, err, nxh, nxl = record_one(algo, hi, lo, cost, now, a, b, c, d)
    else
      answer, err, nxh, nxl = decide_one(algo, hi, lo, cost, now, a, b, c, d)
    end
    if answer == nil then
      return nil, 'key ' .. KEYS[k] .. ': ' .. err
    end
    if answer[1] == 0 then admitted = 0 end
    if nxh ~= nil then writes[#writes + 1] = { k, nxh, nxl, answer[4], tag } end
    answers[i] = answer
  end
  return { admitted, answers, writes }
end

-- Writes one state; the key expires when the state is full again: reset_after us, rounded up
-- to ms, plus the slack.
local function store(wr)
  local ttl = cdiv(wr[4], 1000) + slack
  if ttl < 1 then ttl = 1 end
  redis.call('SET', KEYS[wr[1]], format(wr[2], wr[3]) .. ' ' .. wr[5], 'PX', string.format('%.0f', ttl))
end

-- Mode 2, refunds: each group is `units, granted_us, n` and n limits; its units come back to
-- every limit, all or none, and it answers as a peek after the refund. A key whose limit
-- changed since the grant gives nothing back (its units were rescaled away from the grant).
local function refund_group(units, granted, n, arg)
  local answers, writes = {}, {}
  for i = 1, n do
    local k, algo, a, b, c, d = limit_at(arg)
    if k == nil then return nil, 'limit ' .. i .. ' of the refund is malformed' end
    local tag = tag_at(arg)
    arg = arg + 6
    local state, err = load(KEYS[k])
    if state == nil then return nil, err end
    local hi, lo = state[1], state[2]
    local changed = state[3] ~= nil and state[3] ~= tag and (algo == 1 or algo == 2 or algo == 3)
    if changed then
      hi, lo = rescale(hi, lo, state[3], algo, a, b, c, d)
      if hi == nil then return nil, 'key ' .. KEYS[k] .. ': ' .. lo end
    end
    if algo ~= 1 and algo ~= 2 and algo ~= 3 then
      return nil, 'unknown algorithm ' .. tostring(algo)
    end
    local nxh, nxl
    if not changed then -- a changed limit gives nothing back
      nxh, nxl = refund_one(algo, hi, lo, units, granted, now, a, b, c, d)
    end
    if nxh == nil and nxl ~= nil then return nil, 'key ' .. KEYS[k] .. ': ' .. nxl end
    if nxh ~= nil then hi, lo = nxh, nxl end
    local answer
    answer, err = decide_one(algo, hi, lo, 0, now, a, b, c, d)
    if answer == nil then return nil, 'key ' .. KEYS[k] .. ': ' .. err end
    if nxh ~= nil then writes[#writes + 1] = { k, hi, lo, answer[4], tag } end
    answers[i] = answer
  end
  return answers, writes
end

-- Mode 3, leases. A node holding a lease decides locally against units it took from the
-- state ahead of time; each limit's ledger (a hash: holder -> "units deadline_us granted_us")
-- records the leases outstanding, so that they never add up to more than the limit's slack.
-- A group: returns the `returned` units of the holder's live lease (never more than the
-- ledger says it holds; nothing once the lease expired or the limit changed), ends that lease,
-- then takes `cost` units for the caller and up to `want` more as a new lease of `ttl_ms`:
-- no more than the state holds beyond the cost, and on each limit no more than an equal share
-- of what the slack leaves once the other live leases are counted: (slack - held) / (holders
-- + 1). A holder that asked for a lease is recorded even when it got none, so the others'
-- next shares make room for it. Nothing is taken unless every limit holds the cost (then the
-- answers are the denial); a want of 0 takes no lease and leaves the ledger. Expired leases
-- leave the ledger (their units are lost, never returned: the holder may have spent them).
local function lease_group(cost, want, returned, holder, ttl, n, arg)
  local limits = {}
  local lease = want
  for i = 1, n do
    local k, algo, a, b, c, d = limit_at(arg)
    local ledger, share = tonumber(ARGV[arg + 6]), tonumber(ARGV[arg + 7])
    if k == nil or ledger == nil or KEYS[ledger] == nil or share == nil or share < 0 then
      return nil, 'limit ' .. i .. ' of the lease is malformed'
    end
    if algo ~= 1 and algo ~= 2 and algo ~= 3 then return nil, 'unknown algorithm ' .. tostring(algo) end
    local tag = tag_at(arg)
    arg = arg + 8
    local entries = redis.pcall('HGETALL', KEYS[ledger])
    if type(entries) == 'table' and entries.err then
      return nil, 'key ' .. KEYS[ledger] .. ' is not a lease ledger (' .. entries.err .. '); delete it or change the prefix'
    end
    local held, holders, mine = 0, 0, nil
    for j = 1, #entries, 2 do
      local units, deadline, granted = string.match(entries[j + 1], '^(%d+) (%d+) (%d+)$')
      units, deadline, granted = tonumber(units), tonumber(deadline), tonumber(granted)
      if units == nil or deadline <= now then
        redis.call('HDEL', KEYS[ledger], entries[j])
      elseif entries[j] == holder then
        mine = { units, granted }
      else
        held = held + units
        holders = holders + 1
      end
    end
    local state, err = load(KEYS[k])
    if state == nil then return nil, err end
    local hi, lo = state[1], state[2]
    local changed = state[3] ~= nil and state[3] ~= tag
    if changed then
      hi, lo = rescale(hi, lo, state[3], algo, a, b, c, d)
      if hi == nil then return nil, 'key ' .. KEYS[k] .. ': ' .. lo end
    end
    local dirty = changed
    if mine ~= nil and returned > 0 and not changed then
      local units = returned
      if units > mine[1] then units = mine[1] end
      local nxh, nxl = refund_one(algo, hi, lo, units, mine[2], now, a, b, c, d)
      if nxh == nil and nxl ~= nil then return nil, 'key ' .. KEYS[k] .. ': ' .. nxl end
      if nxh ~= nil then hi, lo, dirty = nxh, nxl, true end
    end
    local answer
    answer, err = decide_one(algo, hi, lo, 0, now, a, b, c, d)
    if answer == nil then return nil, 'key ' .. KEYS[k] .. ': ' .. err end
    local room = answer[2] - cost
    if room < lease then lease = room end
    local free = share - held
    if free < 0 then free = 0 end
    free = fdiv(free, holders + 1)
    if free < lease then lease = free end
    limits[i] = { k = k, algo = algo, a = a, b = b, c = c, d = d, tag = tag, hi = hi, lo = lo,
      dirty = dirty, ledger = KEYS[ledger], peek = answer }
  end
  if lease < 0 then lease = 0 end
  -- Decides every limit at `take`; nil when one of them does not admit it.
  local function take_all(take)
    local answers, writes = {}, {}
    for i, l in ipairs(limits) do
      local answer, err, nxh, nxl = decide_one(l.algo, l.hi, l.lo, take, now, l.a, l.b, l.c, l.d)
      if answer == nil then return nil, 'key ' .. KEYS[l.k] .. ': ' .. err end
      if answer[1] == 0 then return nil end
      answers[i] = answer
      if nxh ~= nil then
        writes[i] = { l.k, nxh, nxl, answer[4], l.tag }
      elseif l.dirty then
        writes[i] = { l.k, l.hi, l.lo, answer[4], l.tag }
      end
    end
    return answers, writes
  end
  local answers, writes = take_all(cost + lease)
  if answers == nil and writes ~= nil then return nil, writes end
  if answers == nil and lease > 0 then
    -- a window's remaining count can be rounded: the cost alone may still fit
    lease = 0
    answers, writes = take_all(cost)
    if answers == nil and writes ~= nil then return nil, writes end
  end
  local admitted = 1
  if answers == nil then
    -- Denied: nothing is taken; the answers say when the cost fits. A returned lease still
    -- comes back.
    admitted, lease = 0, 0
    answers, writes = {}, {}
    for i, l in ipairs(limits) do
      local answer, err = decide_one(l.algo, l.hi, l.lo, cost, now, l.a, l.b, l.c, l.d)
      if answer == nil then return nil, 'key ' .. KEYS[l.k] .. ': ' .. err end
      answers[i] = answer
      if l.dirty then writes[i] = { l.k, l.hi, l.lo, l.peek[4], l.tag } end
    end
  end
  for i, l in ipairs(limits) do
    if writes[i] ~= nil then store(writes[i]) end
    if want > 0 then
      -- Recorded even with nothing leased, so the other holders' shares make room for it.
      redis.call('HSET', l.ledger, holder, string.format('%.0f %.0f %.0f', lease, now + ttl * 1000, now))
      local left = redis.call('PTTL', l.ledger)
      if left < ttl then redis.call('PEXPIRE', l.ledger, string.format('%.0f', ttl + slack)) end
    else
      redis.call('HDEL', l.ledger, holder)
    end
  end
  return { admitted, lease, answers }
end

if mode == 3 then
  local reply = { now }
  local arg = 5
  for _ = 1, groups do
    local cost, want, returned = tonumber(ARGV[arg]), tonumber(ARGV[arg + 1]), tonumber(ARGV[arg + 2])
    local holder, ttl, n = ARGV[arg + 3], tonumber(ARGV[arg + 4]), tonumber(ARGV[arg + 5])
    if cost == nil or want == nil or returned == nil or ttl == nil or n == nil or holder == nil
      or cost < 0 or want < 0 or returned < 0 or ttl < 1 or want >= LIMIT or returned >= LIMIT then
      return fail('a lease header is malformed')
    end
    local result, err = lease_group(cost, want, returned, holder, ttl, n, arg + 6)
    arg = arg + 6 + 8 * n
    if result == nil then
      reply[#reply + 1] = 'limiter: ' .. err
    else
      reply[#reply + 1] = result[1]
      reply[#reply + 1] = out(result[2])
      for _, answer in ipairs(result[3]) do
        for j = 1, 4 do reply[#reply + 1] = out(answer[j]) end
      end
    end
  end
  return reply
end

if mode == 2 then
  local reply = { now }
  local arg = 5
  for _ = 1, groups do
    local units, granted, n = tonumber(ARGV[arg]), tonumber(ARGV[arg + 1]), tonumber(ARGV[arg + 2])
    -- `now`: units given back without a grant, as taken now (a window's current count)
    if ARGV[arg + 1] == 'now' then granted = now end
    if units == nil or granted == nil or n == nil or units < 0 or granted < 0 then
      return fail('a refund header is malformed')
    end
    local answers, writes = refund_group(units, granted, n, arg + 3)
    arg = arg + 3 + 6 * n
    if answers == nil then
      reply[#reply + 1] = 'limiter: ' .. writes
    else
      for _, wr in ipairs(writes) do store(wr) end
      reply[#reply + 1] = 1
      for _, answer in ipairs(answers) do
        for j = 1, 4 do reply[#reply + 1] = out(answer[j]) end
      end
    end
  end
  return reply
end

local results = {} -- per group: {status, answers} or {error message}
local pending = {} -- mode 1: the writes of admitted groups, done once the batch admits
local heads = {} -- per group: cost, n, the ARGV index of its first limit, whether it records
local blocked = false
local arg = 5
for g = 1, groups do
  local cost = tonumber(ARGV[arg])
  local kind = tonumber(ARGV[arg + 1])
  local n = tonumber(ARGV[arg + 2])
  if cost == nil or n == nil or cost < 0 or (kind ~= 0 and kind ~= 1 and kind ~= 2) then
    return fail('a group header is malformed')
  end
  local record = kind == 2
  heads[g] = { cost, n, arg + 3, record }
  local result, err = decide_group(cost, n, arg + 3, record)
  arg = arg + 3 + 6 * n
  if result == nil then
    results[g] = { err }
    if kind == 1 then blocked = true end
  else
    results[g] = { result[1], result[2] }
    if result[1] == 1 or record then
      for _, wr in ipairs(result[3]) do
        states[KEYS[wr[1]]] = { wr[2], wr[3], wr[5] }
        if mode == 0 then store(wr) else pending[#pending + 1] = wr end
      end
    elseif kind == 1 then
      blocked = true
    end
  end
end

if mode == 1 then
  if blocked then
    -- Only the records are written, recorded again in order on the state as read; admitted
    -- groups then report the state the batch leaves.
    states = {}
    for name, state in pairs(before) do states[name] = state end
    for g = 1, groups do
      if heads[g][4] and results[g][1] ~= nil and type(results[g][1]) ~= 'string' then
        local result = decide_group(heads[g][1], heads[g][2], heads[g][3], true)
        if result ~= nil then
          results[g] = { result[1], result[2] }
          for _, wr in ipairs(result[3]) do
            states[KEYS[wr[1]]] = { wr[2], wr[3], wr[5] }
            store(wr)
          end
        end
      end
    end
    for g = 1, groups do
      if not heads[g][4] and results[g][1] == 1 then
        local result = decide_group(0, heads[g][2], heads[g][3], false)
        if result ~= nil then results[g] = { 1, result[2] } end
      end
    end
  else
    for _, wr in ipairs(pending) do store(wr) end
  end
end

local reply = { now }
for g = 1, groups do
  local result = results[g]
  if type(result[1]) == 'string' then
    reply[#reply + 1] = 'limiter: ' .. result[1]
  else
    reply[#reply + 1] = result[1]
    for _, answer in ipairs(result[2]) do
      for j = 1, 4 do reply[#reply + 1] = out(answer[j]) end
    end
  end
end
return reply
