-- lanes: a room's priority lanes. Reads and writes `lane:<n>` and meta's
-- `turns`.
--
-- A lane is a ZSET visitor -> seq of its own (`lane:1` .. `lane:MAX_LANES`,
-- beside the room's other keys, so in its hash tag): FIFO by seq within
-- the lane, a position counted within the lane only, so nobody's shown
-- position moves because someone entered another lane. Lane 0 is the
-- general queue (`queue` and the tail). Lanes hold few visitors (those
-- with a code or a token's claim): no tail, no batches, no description.
--
-- Whose turn it is goes by stride scheduling, exactly as
-- `store::LaneTurns::take` (the model and the memory store share it):
-- meta `turns` = "<virtual time>,<pass of lane 0>,...,<pass of lane MAX>".
--
-- Invariants (checked by check.lua):
--   L1 every seq in a lane is above the reset floor and at most last_seq;
--   L2 a visitor waits in one lane at most (the general queue included).

-- Whether the general queue is held: the room has lanes and its presale
-- window (the policy's `lanes_until`, against the call's `now`) has not
-- ended, so only the lanes are let in (`store::Lanes::general_held`).
local function general_held(c)
    return c.p.lanes ~= nil and c.now < c.p.lanes_until
end

-- Lane `lane`'s key (1 ..).
local function lane_key(c, lane)
    return c.k.lane_prefix .. lane
end

-- The turns as meta holds them (all 0 when it holds none).
local function turns_of(c)
    local t = { vt = 0, pass = {} }
    for lane = 0, MAX_LANES do
        t.pass[lane] = 0
    end
    local s = redis.call('HGET', c.k.meta, 'turns')
    if s then
        local i = -1
        for v in string.gmatch(s, '[^,]+') do
            if i < 0 then
                t.vt = tonumber(v)
            elseif i <= MAX_LANES then
                t.pass[i] = tonumber(v)
            end
            i = i + 1
        end
    end
    return t
end

local function turns_save(c, t)
    local parts = { int(t.vt) }
    for lane = 0, MAX_LANES do
        parts[#parts + 1] = int(t.pass[lane])
    end
    redis.call('HSET', c.k.meta, 'turns', table.concat(parts, ','))
end

-- The lanes in the order ties go: the general queue, then the configured ones.
local function lane_order(lanes)
    local order = {}
    for lane = 0, lanes.count do
        order[#order + 1] = lane
    end
    return order
end

-- The lane whose turn it is among those `waiting[lane]` marks, and the
-- turns after it is taken (`t` is left alone: the caller keeps the new
-- turns only if that lane did have someone to admit). nil if nobody waits.
local function next_turn(t, lanes, waiting)
    local order = lane_order(lanes)
    local best, best_pass
    for _, lane in ipairs(order) do
        if lanes.shares[lane] > 0 and waiting[lane] then
            local pass = math.max(t.pass[lane], t.vt)
            if not best or pass < best_pass then
                best, best_pass = lane, pass
            end
        end
    end
    local after = { vt = t.vt, pass = {} }
    for lane = 0, MAX_LANES do
        after.pass[lane] = t.pass[lane]
    end
    if not best then
        for _, lane in ipairs(order) do
            if waiting[lane] then
                return lane, after
            end
        end
        return nil, after
    end
    after.vt = best_pass
    after.pass[best] = best_pass + math.floor(STRIDE / lanes.shares[best])
    if after.vt > PASS_LIMIT then
        local by = after.vt
        after.vt = 0
        for lane = 0, MAX_LANES do
            after.pass[lane] = math.max(0, after.pass[lane] - by)
        end
    end
    return best, after
end

-- The visitor's place in lane `lane` as a Queued verdict, or nil.
local function lane_place(c, lane, visitor)
    local key = lane_key(c, lane)
    local seq = redis.call('ZSCORE', key, visitor)
    if not seq then
        return nil
    end
    local rank = redis.call('ZRANK', key, visitor)
    return { QUEUED, tonumber(seq), rank + 1, redis.call('ZCARD', key) }
end

-- The lane (1 ..) the visitor waits in, if any.
local function lane_of(c, visitor)
    for lane = 1, MAX_LANES do
        if redis.call('ZSCORE', lane_key(c, lane), visitor) then
            return lane
        end
    end
    return nil
end

-- Visitors waiting in the lanes.
local function lanes_length(c)
    local n = 0
    if c.p.lanes then
        for lane = 1, c.p.lanes.count do
            n = n + redis.call('ZCARD', lane_key(c, lane))
        end
    end
    return n
end
