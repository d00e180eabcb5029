-- room: what every decision does, built from the parts above. Reads and
-- writes every key; owns `ended`, `places` and meta's counters.
--
-- What every call must do before deciding (`housekeep`) is kept to what
-- the decision depends on: expired sessions leave (capacity) and old
-- admissions leave the rate window (rate). What only needs doing now and
-- then (`maintain`: abandonment, forgetting old ended marks, key expiry)
-- runs in the functions the daemon calls periodically (stats, frontier),
-- so the per-visitor functions stay short.
--
-- Invariants (checked by check.lua):
--   R1 active sessions (`sessions` plus the batched count) never grow past
--      the cap by an admission or a promotion (I1); a session a ticket
--      brings back after a loss may (check_in.lua);
--   R2 admissions in the window never grow past the rate (I2);
--   R3 while someone waits in an open room that promotes, the room is
--      full (I4): promotion runs in every call, and takes the head first
--      in FIFO rooms (I3);
--   R4 an `ended` or `places` mark holds its visitor's ticket void until
--      its score: a released or revoked session, a released place, a
--      place that became a session (`used_places`), the sessions of a
--      reset.

-- Whether a mark in `key` (ended sessions or places) is still in force.
local function marked(c, key, visitor)
    local until_ms = redis.call('ZSCORE', key, visitor)
    return until_ms ~= false and until_ms ~= nil and tonumber(until_ms) > c.now
end

-- Whether the place a ticket carries (`seq`) was ended: released, used up
-- by an admission, or issued before a reset. Putting it back would admit
-- again.
local function place_ended(c, visitor, seq)
    local floor = tonumber(redis.call('HGET', c.k.meta, 'reset_floor') or '0')
    return seq <= floor or marked(c, c.k.places, visitor) or marked(c, c.k.ended, visitor)
end

-- Reads the figures every decision needs, once per call: active sessions,
-- admissions in the window, meta's last_seq (as text) and ttl_slot.
local function counts(c)
    if not c.active_n then
        c.active_n = redis.call('ZCARD', c.k.sessions) + batched(c)
        local m = redis.call('HMGET', c.k.meta, 'window', 'last_seq', 'ttl_slot', 'hold_until', 'hold_for')
        c.window_n = tonumber(m[1] or '0')
        c.last_seq_read = m[2] or '0'
        c.ttl_slot = m[3]
        -- Held after a loss (epoch.lua): the hold starts at this decision.
        c.hold_until = tonumber(m[4] or '0')
        if m[5] then
            c.hold_until = math.max(c.hold_until, c.now + tonumber(m[5]))
            redis.call('HSET', c.k.meta, 'hold_until', int(c.hold_until))
            redis.call('HDEL', c.k.meta, 'hold_for')
        end
        -- The count lives beside the window; should the window key be gone
        -- alone (evicted), the count goes too rather than block admissions.
        -- (Before this call admits anyone: an admission makes the key again.)
        if c.window_n ~= 0 and redis.call('EXISTS', c.k.admits) == 0 then
            c.window_n = 0
            redis.call('HDEL', c.k.meta, 'window')
        end
    end
end

-- What every decision depends on: expired sessions and admissions outside
-- the window are gone.
local function housekeep(c)
    expire_sessions(c)
    expire_window(c)
end

-- Moves every room key's expiry forward, so a room nobody uses any more
-- disappears on its own instead of leaking memory.
local function expire_all(c)
    local k, ttl = c.k, c.p.key_ttl_ms
    for _, key in ipairs({ k.sessions, k.queue, k.polls, k.admits, k.meta, k.ended, k.places,
        k.tail, k.batches, k.tail_seqs }) do
        redis.call('PEXPIRE', key, ttl)
    end
    each_tail_chunk(c, function(key)
        redis.call('PEXPIRE', key, ttl)
    end)
    for lane = 1, MAX_LANES do
        redis.call('PEXPIRE', lane_key(c, lane), ttl)
    end
end

-- For calls that write the room's keys: the keys in `created` (those this
-- call may have created) get their expiry at once, and once in every ten
-- seconds of the clock all of them do (maintain() does it too, but a room
-- must expire even if nothing calls maintain any more). Far cheaper than
-- an expiry per key per call.
local function keep_alive(c, created)
    counts(c)
    -- The ten seconds `now` is in, as a string (now_s without its last
    -- four digits): a new one means a refresh.
    local slot = string.sub(c.now_s, 1, -5)
    if slot ~= c.ttl_slot then
        redis.call('HSET', c.k.meta, 'ttl_slot', slot)
        c.ttl_slot = slot
        expire_all(c)
    else
        for _, key in ipairs(created) do
            redis.call('PEXPIRE', key, c.p.key_ttl_ms)
        end
    end
end

-- The periodic part: visitors who stopped polling lose their place (the
-- sweep moves through the queue SWEEP_MAX places a call; promotion checks
-- whoever it is about to admit, so nobody gone is ever admitted), marks
-- of ended sessions and places are forgotten once they can no longer
-- matter, and the room's keys stay alive while the room is in use.
local function maintain(c)
    redis.call('ZREMRANGEBYSCORE', c.k.ended, '-inf', c.now_s)
    redis.call('ZREMRANGEBYSCORE', c.k.places, '-inf', c.now_s)
    if c.p.abandon_ms > 0 then
        local from = tonumber(redis.call('HGET', c.k.meta, 'sweep') or '0')
        local len = redis.call('ZCARD', c.k.queue)
        if from >= len or len <= SWEEP_MAX then
            from = 0
        end
        local look = redis.call('ZRANGE', c.k.queue, from, from + SWEEP_MAX - 1, 'WITHSCORES')
        local gone = gone_of(c, look)
        drop(c, gone)
        local next_from = from + #look / 2 - #gone
        if next_from >= len - #gone then
            next_from = 0
        end
        redis.call('HSET', c.k.meta, 'sweep', int(next_from))
        -- Polls written for visitors no longer waiting (they left between
        -- a poll and its write): a few random ones a call are checked. (Not
        -- while there is a tail: its places are not in `queue`; refill
        -- clears the records of those who left it.)
        local sampled = {}
        if not tail_ends(c) then
            sampled = redis.call('HRANDFIELD', c.k.polls, 16)
        end
        if #sampled > 0 then
            local waiting = redis.call('ZMSCORE', c.k.queue, unpack(sampled))
            local stale = {}
            for i, v in ipairs(sampled) do
                if not waiting[i] and v ~= SINCE and not (c.p.lanes and lane_of(c, v)) then
                    stale[#stale + 1] = v
                end
            end
            if #stale > 0 then
                redis.call('HDEL', c.k.polls, unpack(stale))
            end
        end
    end
    if c.p.abandon_ms > 0 and c.p.lanes then
        -- The lanes hold few: their first SWEEP_MAX each.
        for lane = 1, c.p.lanes.count do
            local key = lane_key(c, lane)
            local gone = gone_of(c, redis.call('ZRANGE', key, 0, SWEEP_MAX - 1, 'WITHSCORES'))
            if #gone > 0 then
                redis.call('ZREM', key, unpack(gone))
                redis.call('HDEL', c.k.polls, unpack(gone))
                redis.call('HINCRBY', c.k.meta, 'abandoned', #gone)
            end
        end
    end
    refill_head(c)
    expire_all(c)
end

-- How many more admissions the limits allow right now (math.huge if none).
local function free_room(c)
    counts(c)
    if (c.hold_until or 0) > c.now and (c.capped or c.rated) then
        -- Held after a loss: the sessions that survive on their tickets
        -- are counted at their check-ins first (epoch.lua).
        return 0
    end
    local free = math.huge
    if c.capped then
        free = math.min(free, c.cap - c.active_n)
    end
    if c.rated then
        free = math.min(free, c.rate - c.window_n)
    end
    return free
end

-- One window member for `n` admissions made now. Its id comes from the
-- `admitted` counter, which only grows, so members never collide.
local function record_admissions(c, n)
    local n_s = count_string(n)
    local last = redis.call('HINCRBY', c.k.meta, 'admitted', n_s)
    redis.call('ZADD', c.k.admits, c.now_s, int(last) .. ':' .. n_s)
    redis.call('HINCRBY', c.k.meta, 'window', n_s)
    counts(c)
    c.window_n = c.window_n + n
end

-- Admits `visitor` now, one session of its own.
local function admit(c, visitor)
    local expiry = c.now + c.p.session_ms
    redis.call('ZADD', c.k.sessions, int(expiry), visitor)
    record_admissions(c, 1)
    c.active_n = c.active_n + 1
    return { ADMITTED, expiry }
end

-- Queue places that became sessions are used up: each is marked ended as
-- long as its ticket could poll (abandon_after from now; the ticket was
-- last issued at or before now), so that once the session is over (by
-- expiry included) the ticket makes its holder a newcomer instead of
-- putting the place back at its seq (see poll). `args` are ZADD's (score,
-- visitor) pairs; the scores are overwritten.
local function used_places(c, args)
    local until_ms = int(c.now + c.p.abandon_ms)
    for i = 1, #args, 2 do
        args[i] = until_ms
    end
    redis.call('ZADD', c.k.ended, 'GT', unpack(args))
end

-- Whether the room lets waiting visitors in (open or queue-all, not
-- passthrough, which has no queue of its own).
local function promotes(c)
    local state = c.p.state
    return (state == 'open' or state == 'queue_all') and c.p.method ~= 'passthrough'
end

-- Takes up to `limit` visitors from the front of the general queue (FIFO,
-- random, or up to another region's oldest waiter), at most the free room
-- less `taken` (admissions this call already chose elsewhere): removed
-- from `queue`, not yet admitted. Whoever stopped polling is dropped
-- instead; after `rounds` runs that each found someone gone, it stops, and
-- the second value is true: more may wait behind those it dropped.
local function take_general(c, limit, taken, rounds)
    local method = c.p.method
    local k = c.k
    if method == 'random' and tail_ends(c) then
        -- A random pick is over the whole queue: a room that turned random
        -- with a tail moves it over once (as long as the queue, as the
        -- event's shuffle).
        refill(c, math.huge)
    end
    local chosen = {}
    local cut_short = false
    for round = 1, rounds do
        local want = math.min(free_room(c) - taken - #chosen, limit - #chosen)
        if want <= 0 then
            break
        end
        local waiting = redis.call('ZCARD', k.queue)
        -- Only places ahead of the tail may go in (in `queue`, places at or
        -- past the tail's first seq were written by an instance of an
        -- earlier version that did not know the tail). A refill may move up
        -- only places whose visitors left, so it goes on until enough are
        -- ahead or the tail is empty.
        local ahead = waiting
        while tail_ends(c) do
            ahead = redis.call('ZCOUNT', k.queue, '-inf', '(' .. int(c.tail_first.first))
            if ahead >= want then
                break
            end
            refill(c, want - ahead)
            waiting = redis.call('ZCARD', k.queue)
            ahead = waiting
        end
        local in_tail = tail_length(c)
        c.queue_n = waiting + in_tail
        local n = math.min(want, ahead)
        if n <= 0 then
            break
        end
        local candidates
        if method == 'random' then
            candidates = redis.call('ZRANDMEMBER', k.queue, n, 'WITHSCORES')
        elseif c.region_bound then
            -- Visitors who arrived after another region's oldest waiter wait
            -- for it (I3 across regions). Equal seqs arrived in the same
            -- millisecond: both regions may go, or neither ever would.
            candidates = redis.call('ZRANGEBYSCORE', k.queue, '-inf', int(c.region_bound),
                'WITHSCORES', 'LIMIT', 0, n)
        else
            candidates = redis.call('ZRANGE', k.queue, 0, n - 1, 'WITHSCORES')
        end
        local gone, keep = gone_of(c, candidates)
        drop(c, gone)
        c.queue_n = waiting - #gone - #keep + in_tail
        if #keep > 0 then
            redis.call('ZREM', k.queue, unpack(keep))
            redis.call('HDEL', k.polls, unpack(keep))
            for _, v in ipairs(keep) do
                chosen[#chosen + 1] = v
            end
        end
        if #gone == 0 then
            break
        end
        cut_short = round == rounds
    end
    return chosen, cut_short
end

-- Takes the first visitor of lane `lane` who still polls (dropping those
-- who stopped, and places a reset voided), removed from the lane; nil if
-- nobody is left there.
local function take_lane(c, lane)
    local key = lane_key(c, lane)
    while true do
        local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
        if #head == 0 then
            return nil
        end
        local visitor = head[1]
        -- (Whether it still polls is read before its record goes.)
        local gone = gone_of(c, head)
        redis.call('ZREM', key, visitor)
        redis.call('HDEL', c.k.polls, visitor)
        if #gone > 0 then
            redis.call('HINCRBY', c.k.meta, 'abandoned', 1)
        elseif tonumber(head[2]) > c.reset_floor then
            return visitor
        end
    end
end

-- Takes whom promotion admits in a room with lanes: one admission at a
-- time, to the lane whose turn it is (lanes.lua), while there is room.
local function take_by_turns(c)
    local budget = math.min(free_room(c), PROMOTE_MAX)
    if budget <= 0 then
        return {}
    end
    local lanes = c.p.lanes
    c.reset_floor = tonumber(redis.call('HGET', c.k.meta, 'reset_floor') or '0')
    -- (In a presale window the general queue is not served at all.)
    local waiting = { [0] = not general_held(c) and queue_length(c) > 0 }
    for lane = 1, lanes.count do
        waiting[lane] = redis.call('ZCARD', lane_key(c, lane)) > 0
    end
    local t = turns_of(c)
    local chosen = {}
    while #chosen < budget do
        local lane, after = next_turn(t, lanes, waiting)
        if not lane then
            break
        end
        local visitor, cut_short
        if lane == 0 then
            local taken
            taken, cut_short = take_general(c, 1, #chosen, SWEEP_MAX)
            visitor = taken[1]
        else
            visitor = take_lane(c, lane)
        end
        if visitor then
            chosen[#chosen + 1] = visitor
            t = after
        elseif cut_short then
            -- The general queue's turn, and the sweep ran out among those
            -- who left: someone may still wait behind them. Giving the
            -- turn to a lane would let it in ahead of its share; the next
            -- call goes on.
            break
        else
            -- Nobody left there (those counted had gone): not its turn.
            waiting[lane] = false
        end
    end
    if #chosen > 0 then
        turns_save(c, t)
    end
    return chosen
end

-- Admits waiting visitors while there is room. A promoted visitor gets its
-- session now, with the arrival grace so it outlives the wait until the
-- visitor's next poll collects it. Whoever stopped polling is dropped
-- instead of admitted. `passthrough` has no queue of its own: a visitor
-- left over from another method is admitted when it next polls.
local function promote(c)
    if not promotes(c) then
        return
    end
    local chosen
    if c.p.lanes then
        chosen = take_by_turns(c)
    else
        chosen = take_general(c, PROMOTE_MAX, 0, 4)
    end
    if #chosen == 0 then
        return
    end
    local k = c.k
    local expiry = int(c.now + c.p.session_ms + c.p.grace_ms)
    local args = {}
    for i, visitor in ipairs(chosen) do
        args[2 * i - 1] = expiry
        args[2 * i] = visitor
    end
    redis.call('ZADD', k.sessions, unpack(args))
    used_places(c, args)
    record_admissions(c, #chosen)
    c.active_n = c.active_n + #chosen
end

-- Puts the visitor in the queue at `seq` and keeps `last_seq` the highest
-- seq ever handed out, so a later next_seq() never reuses or undercuts it.
-- (Written back by save_last_seq().)
local function enqueue(c, visitor, seq)
    local first = tail_ends(c)
    if first and seq >= first.first then
        tail_add(c, seq, int(seq), 1, visitor, true)
    else
        redis.call('ZADD', c.k.queue, int(seq), visitor)
    end
    redis.call('HSET', c.k.polls, visitor, c.now_s)
    if seq > read_last_seq(c) then
        c.last_seq = seq
    end
end

-- Where `visitor` waits, looked up by visitor (no ticket, no seq): its
-- seq, or nil. A stable id's tail place is found by its note
-- (`tail_seqs_of`); else the tail is read TAIL_SCAN members a call from
-- `from`; the second value is where the next call goes on (nil: looked
-- everywhere).
local function waiting_seq(c, visitor, from)
    if from == 0 then
        local seq = redis.call('ZSCORE', c.k.queue, visitor)
        if seq then
            return tonumber(seq), nil
        end
    end
    if not tail_ends(c) then
        return nil, nil
    end
    if from == 0 then
        local noted = tail_seqs_of(c, { visitor })[1]
        if noted and tail_find(c, visitor, tonumber(noted), noted) then
            return tonumber(noted), nil
        end
    end
    local found, next_from = tail_scan(c, { [visitor] = true }, from)
    return found[visitor], next_from
end

-- Where a visitor who arrives by a stable id waits in the tail, if it
-- does, read in one bounded step: by its note, else among the newest
-- TAIL_SCAN members (an id noted by no build before the notes, or put
-- back by a poll). Its seq, or nil.
local function stable_seq(c, visitor)
    if not tail_ends(c) then
        return nil
    end
    local noted = tail_seqs_of(c, { visitor })[1]
    if noted then
        return tonumber(noted)
    end
    return tail_scan(c, { [visitor] = true }, -TAIL_SCAN)[visitor]
end
