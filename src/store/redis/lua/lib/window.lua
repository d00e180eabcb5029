-- window: the sliding rate window (I2). Reads and writes `admits` and
-- meta's `window` and `admitted`.
--
-- One `admits` member per call that admitted, "<id>:<count>" scored by the
-- time of the admissions, where <id> is meta's `admitted` counter after
-- them (it only grows, so members never collide).
--
-- Invariants (checked by check.lua):
--   W1 meta `window` is the sum of the counts of the `admits` members;
--   W2 no member is older than RATE_WINDOW_MS once a call has started
--      (`expire_window` runs first in every call).
-- Admissions are recorded by room.lua's `record_admissions`.

-- How many admissions a window member stands for ("<id>:<count>").
local function admissions_in(member)
    return tonumber(string.match(member, ':(%d+)$') or '1')
end

-- Admissions in `members`, summed.
local function admissions(members)
    local n = 0
    for _, m in ipairs(members) do
        n = n + admissions_in(m)
    end
    return n
end

-- Admissions at or before `now - RATE_WINDOW_MS` leave the window.
local function expire_window(c)
    local cutoff = int(c.now - RATE_WINDOW_MS)
    local old = redis.call('ZRANGEBYSCORE', c.k.admits, '-inf', cutoff)
    if #old > 0 then
        redis.call('ZREMRANGEBYSCORE', c.k.admits, '-inf', cutoff)
        redis.call('HINCRBY', c.k.meta, 'window', -admissions(old))
    end
end
