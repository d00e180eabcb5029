-- lane: a visitor arrives in, or polls from, a priority lane (lanes.lua).
-- ARG_OP = LANE_OP_ARRIVE, LANE_OP_NEW (arrive, an id just made: nobody
-- to look up), LANE_OP_UNSEEN (arrive, a stable id not seen lately: the
-- tail not read) or LANE_OP_POLL, ARG_VISITOR = visitor, ARG_LANE = the
-- lane (1 ..), ARG_SEQ = the seq its ticket carries (poll only).
-- Returns a verdict as arrive and poll do ({ENDED} for an ended place), or
-- {MORE} when the room has room the promotion's bound kept from reaching
-- this visitor (the caller asks again).
--
-- The lib helpers it calls (lua/lib/*.lua; library.rs checks the list):
-- uses: admit, counts, free_room, general_held, housekeep, int, keep_alive,
-- uses: lane_key, lane_of, lane_place, lanes_length, next_seq, place_ended,
-- uses: place_of, promote, promotes, queue_length, read_last_seq,
-- uses: save_last_seq, session_of, stable_seq, tail_find, tail_place,
-- uses: touch_poll, used_places
local op, visitor, lane = c.argv[ARG_OP], c.argv[ARG_VISITOR], tonumber(c.argv[ARG_LANE])
local key = lane_key(c, lane)
local state, method = c.p.state, c.p.method
-- Keys this call may have made, for their expiry (`keep_alive`).
local created = {}

housekeep(c)
counts(c)
-- Admissions made by this call, promotion's included, may make keys.
local window_before = c.window_n
promote(c)

-- The visitor's place in the general queue, looked up by visitor: in
-- `queue`, else in the tail by one bounded read (`stable_seq`).
local function general_place()
    local place = place_of(c, visitor)
    if not place then
        local seq = stable_seq(c, visitor)
        local t = seq and tail_find(c, visitor, seq, int(seq))
        place = t and tail_place(c, t, seq)
    end
    return place
end

-- Whether anyone waits whom promotion would serve: in any lane, and in
-- the general queue unless a presale window holds it.
local function anyone_waiting()
    return (queue_length(c) > 0 and not general_held(c)) or lanes_length(c) > 0
end

-- A place still waiting while the room has room: promotion stopped at its
-- bound before reaching it.
local function within_room(place)
    if place and promotes(c) and free_room(c) > 0 then
        return { MORE }
    end
    return place
end

local function arrive()
    if state == 'closed' then
        redis.call('HINCRBY', c.k.meta, 'rejected', 1)
        return { REJECTED, R_CLOSED }
    end
    -- Waiting already, here or in another lane: that place, not a second.
    if op ~= LANE_OP_NEW then
        local other = lane_of(c, visitor)
        -- (LANE_OP_UNSEEN: the general queue's head only, not the tail.)
        local place = other and lane_place(c, other, visitor)
            or (op == LANE_OP_ARRIVE and general_place() or place_of(c, visitor))
        if place then
            return place
        end
    end
    if state == 'open' and method == 'passthrough' then
        return admit(c, visitor)
    end
    if state == 'open' and method == 'reject' then
        if free_room(c) > 0 then
            return admit(c, visitor)
        end
        redis.call('HINCRBY', c.k.meta, 'rejected', 1)
        return { REJECTED, R_OVER_LIMIT }
    end
    if state == 'open' and free_room(c) > 0 and not anyone_waiting() then
        return admit(c, visitor)
    end
    local len = redis.call('ZCARD', key)
    if c.p.max_queue > 0 and len >= c.p.max_queue then
        redis.call('HINCRBY', c.k.meta, 'rejected', 1)
        return { REJECTED, R_QUEUE_FULL }
    end
    local seq = next_seq(c)
    redis.call('ZADD', key, int(seq), visitor)
    save_last_seq(c)
    redis.call('HINCRBY', c.k.meta, 'queued', 1)
    if len == 0 then
        redis.call('HSETNX', c.k.polls, SINCE, c.now_s)
        created[#created + 1] = key
        created[#created + 1] = c.k.polls
    end
    return { QUEUED, seq, len + 1, len + 1 }
end

local function poll()
    local seq = tonumber(c.argv[ARG_SEQ])
    local waiting = redis.call('ZSCORE', key, visitor)
    if state == 'closed' then
        if waiting then
            -- Keep the place: a room that reopens finds its lanes as they were.
            touch_poll(c, visitor)
        end
        return { REJECTED, R_CLOSED }
    end
    local function ended()
        return place_ended(c, visitor, seq)
    end
    if method == 'passthrough' and state ~= 'paused' then
        if not waiting and ended() then
            return { ENDED }
        end
        if waiting then
            redis.call('ZREM', key, visitor)
            redis.call('HDEL', c.k.polls, visitor)
        end
        used_places(c, { 0, visitor })
        return admit(c, visitor)
    end
    if waiting then
        touch_poll(c, visitor)
        return within_room(lane_place(c, lane, visitor))
    end
    if ended() then
        return { ENDED }
    end
    -- The store lost the place but the ticket holds its order: put back
    -- in its lane where it was (I5); it may now be first.
    redis.call('ZADD', key, int(seq), visitor)
    touch_poll(c, visitor)
    created[#created + 1] = key
    created[#created + 1] = c.k.polls
    if seq > read_last_seq(c) then
        c.last_seq = seq
    end
    save_last_seq(c)
    promote(c)
    local expiry = session_of(c, visitor)
    if expiry then
        return { ADMITTED, expiry }
    end
    return within_room(lane_place(c, lane, visitor)) or { ENDED }
end

local function decide()
    if op == LANE_OP_NEW then
        return arrive()
    end
    local expiry = session_of(c, visitor)
    if expiry then
        return { ADMITTED, expiry }
    end
    if op == LANE_OP_POLL then
        return poll()
    end
    return arrive()
end

local out = decide()
if c.window_n ~= window_before then
    -- An admission (here or by promotion) may have made these.
    for _, k in ipairs({ c.k.sessions, c.k.admits, c.k.ended }) do
        created[#created + 1] = k
    end
end
keep_alive(c, created)
return out
