-- tail: the back of a long queue, written one member per batch. Reads and
-- writes `tail`, the `tail_ids:<n>` chunks and (when places move up)
-- `queue` and `polls`; reads `sessions`, `places` and meta's
-- `reset_floor` to leave out who left.
--
-- A queue place in `queue` is a sorted-set entry per visitor, and writing
-- it is most of what a queued newcomer costs Redis (docs/redis-layout.md).
-- Once `queue` holds HEAD_WINDOW places, newcomers go to the tail instead:
-- a batch of k queued newcomers, who get consecutive seqs, is one member
-- (first seq, k, cum, offset) scored by its first seq, and their ids (32
-- characters each) are written in arrival order to the room's ids, the
-- first at id number <offset>: id number o is at byte 32 * (o % CHUNK) of
-- the string key `tail_ids:<o // CHUNK>`. `cum` is how many places the
-- tail had taken in before it (the last member's cum plus its k), so the
-- places ahead of a member in the tail are its cum minus the first
-- member's. Members hold their numbers as 8-byte doubles (`struct`):
-- reading a number from its decimal digits (strtod) costs Redis more than
-- the command that fetched it.
--
-- The ids are in chunks of CHUNK (2 MB in production), not one string, so
-- that ids that moved up go with their chunk (a `DEL`), and nothing is
-- ever copied to cut them off. (The chunks' keys are made from the ninth
-- key, their common prefix: they share its `{room}` tag, so its slot.)
-- Ids are written where their number says (`SETRANGE`), so whatever a
-- chunk held before cannot shift them, and read back only by a member
-- that wrote them; a chunk lost reads as bytes that are no visitor's id.
--
-- A poll finds its place by its ticket's seq, which finds the member; its
-- visitor must be at its offset there. Only a release or an arrival that
-- knows no seq looks the tail up by visitor (`tail_scan`, a bounded part
-- per call). Places move from the tail's front into `queue` as the head
-- nears them (`refill`, in whole members): who left while in the tail
-- (released, admitted in passthrough, stopped polling, or before a reset)
-- is left out then, so until then the tail counts them in positions and
-- lengths: a position shown far back may be too high by the visitors ahead
-- who left; never too low, so nobody is admitted early and nobody is
-- overtaken.
--
-- A place put back inside the tail (a poll of a place the store lost, I5)
-- is a member of its own that carries its id, and the tail's end cum as it
-- was put back: (seq, 1, cum, end) and then the id. It counts in no length
-- until it moves up (after a loss, positions behind it may be one too low
-- per place put back).
--
-- Invariants (checked by check.lua):
--   T1 members are scored by their first seq, every seq above `queue`'s;
--   T2 a member's cum is at least the previous member's cum plus its k
--      (more when a place put back between them extended the end), but
--      for members put back (they take the cum of the place they follow);
--   T3 offsets grow with seqs: a member's ids are never behind an earlier
--      member's, and every id a member points to is in a chunk key;
--   T4 every chunk key the members point into exists and expires with
--      the room (at any queue size).

-- A member's four numbers; a member longer than MEMBER_LEN carries its ids.
local MEMBER = '>dddd'
local MEMBER_LEN = 32
-- How long a queue place released while it may be in the tail stays
-- marked beyond abandon_after: longer than any queue description lives,
-- so a poll answered from one after the release cannot keep it (refill
-- drops it as abandoned once the mark is gone).
local TAIL_MARK_MS = 60000
-- Members a visitor search reads per call (`tail_scan`).
local TAIL_SCAN = 64

-- A tail member's first seq, count, cum, the tail's end cum if it is the
-- last (`stop`), and its ids' offset (or, for a member that carries its
-- ids, where they start in it).
local function tail_member(m)
    local first, k, cum, x = struct.unpack(MEMBER, m)
    if #m > MEMBER_LEN then
        return {
            first = first, k = k, cum = cum, stop = x, off = false, inline = MEMBER_LEN + 1, m = m,
        }
    end
    return { first = first, k = k, cum = cum, stop = cum + k, off = x, inline = false, m = m }
end

-- The key of ids chunk `n` (TAIL_CHUNK_PREFIX .. n, ctx.lua's `keys_of`).
local function chunk_key(c, n)
    return c.k.tail_chunk_prefix .. int(n)
end

-- The ids of places i .. i+n-1 (0-based) of member `t`, joined: always n
-- ids long, where the ids a chunk lost read as '?'s or zero bytes (no
-- visitor's id: `is_id`).
local function tail_ids(c, t, i, n)
    if t.inline then
        local at = t.inline + ID_LEN * i
        return string.sub(t.m, at, at + ID_LEN * n - 1)
    end
    local parts = {}
    local o = t.off + i
    while n > 0 do
        local chunk = math.floor(o / CHUNK)
        local within = o - chunk * CHUNK
        local take = math.min(n, CHUNK - within)
        local got = redis.call('GETRANGE', chunk_key(c, chunk), int(ID_LEN * within),
            int(ID_LEN * (within + take) - 1))
        if #got < ID_LEN * take then
            got = got .. string.rep('?', ID_LEN * take - #got)
        end
        parts[#parts + 1] = got
        o, n = o + take, n - take
    end
    return #parts == 1 and parts[1] or table.concat(parts)
end

-- Whether `s` (ID_LEN characters) can be a visitor id: hex digits only.
local function is_id(s)
    return string.find(s, '^%x+$') ~= nil
end

-- Writes `ids` (joined) as id numbers o, o+1, ...; a chunk new to the
-- room gets its expiry at once.
local function ids_write(c, o, ids)
    local n, from = #ids / ID_LEN, 1
    while n > 0 do
        local chunk = math.floor(o / CHUNK)
        local within = o - chunk * CHUNK
        local take = math.min(n, CHUNK - within)
        local key = chunk_key(c, chunk)
        local part = ids
        if take * ID_LEN ~= #ids then
            part = string.sub(ids, from, from + ID_LEN * take - 1)
        end
        if redis.call('SETRANGE', key, int(ID_LEN * within), part) == ID_LEN * take then
            redis.call('PEXPIRE', key, c.p.key_ttl_ms)
        end
        o, n, from = o + take, n - take, from + ID_LEN * take
    end
end

-- The tail's first and last members (false, false when it is empty).
local function tail_ends(c)
    if c.tail_first == nil then
        local a = redis.call('ZRANGE', c.k.tail, '0', '0')
        if #a == 0 then
            c.tail_first, c.tail_last = false, false
        else
            c.tail_first = tail_member(a[1])
            c.tail_last = tail_member(redis.call('ZRANGE', c.k.tail, '-1', '-1')[1])
        end
    end
    return c.tail_first, c.tail_last
end

-- The tail changed: its ends are read again when next needed.
local function tail_changed(c)
    c.tail_first, c.tail_last = nil, nil
end

-- The id number after the tail's last ids: one past the offset and count of
-- the last member that has an offset (offsets grow with seqs), 0 if none.
local function ids_end(c)
    local _, last = tail_ends(c)
    if not last then
        return 0
    end
    if last.off then
        return last.off + last.k
    end
    local from = 0
    while true do
        local ms = redis.call('ZRANGE', c.k.tail, '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', from, 64)
        for _, m in ipairs(ms) do
            local t = tail_member(m)
            if t.off then
                return t.off + t.k
            end
        end
        if #ms < 64 then
            return 0
        end
        from = from + 64
    end
end

-- The chunks that hold the ids from number `lo` to number `hi` - 1, for `f`.
local function each_chunk(c, lo, hi, f)
    for n = math.floor(lo / CHUNK), math.floor((hi - 1) / CHUNK) do
        f(chunk_key(c, n))
    end
end

-- Places in the tail (counting those that left it unseen, see above).
local function tail_length(c)
    local first, last = tail_ends(c)
    if not first then
        return 0
    end
    return math.max(last.stop - first.cum, 0)
end

-- Places waiting: in `queue` and in the tail.
local function queue_length(c)
    return redis.call('ZCARD', c.k.queue) + tail_length(c)
end

-- Whether `k` new places (seqs above every seq handed out) go to the tail:
-- whenever it is not empty (they are behind every place in it), and in a
-- FIFO room once the head is full (a random pick is over the whole queue,
-- which promotion moves to `queue` first).
local function to_tail(c, k)
    if tail_ends(c) then
        return true
    end
    return c.p.method == 'fifo' and redis.call('ZCARD', c.k.queue) + k > HEAD_WINDOW
end

-- Writes `ids` (k ids joined) as the tail's places at seqs first..first+k-1.
-- `first_s` is `first` as a string; `back` is true for a place put back
-- (its seq was handed out before), false for newcomers (above every seq).
local function tail_add(c, first, first_s, k, ids, back)
    if #ids ~= ID_LEN * k then
        error('visitor ids in the tail must be ' .. ID_LEN .. ' characters')
    end
    local tail_first, last = tail_ends(c)
    local cum = 0
    local member
    if last and (back or first < last.first + last.k) then
        -- Put back inside the tail (by a poll, I5), or newcomers whose seqs
        -- are not above the tail's (after a lost last_seq, with clocks
        -- apart): the member carries its ids and takes the cum of the place
        -- it follows, so positions behind it are too low until it moves to
        -- `queue`, and it counts in no length.
        local before = redis.call('ZRANGE', c.k.tail, first_s, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)
        if #before == 1 then
            local b = tail_member(before[1])
            cum = b.cum + math.min(b.k, first - b.first)
        else
            cum = tail_first.cum
        end
        -- (Put back past the end, it extends the end: counted too many,
        -- never too few.)
        member = struct.pack(MEMBER, first, k, cum, math.max(last.stop, cum + k)) .. ids
    else
        if last then
            cum = last.stop
        end
        local off = ids_end(c)
        ids_write(c, off, ids)
        member = struct.pack(MEMBER, first, k, cum, off)
    end
    redis.call('ZADD', c.k.tail, first_s, member)
    tail_changed(c)
end

-- The tail member holding `visitor` at `seq` (`seq_s` as a string), or nil.
local function tail_find(c, visitor, seq, seq_s)
    local first = tail_ends(c)
    if not first or seq < first.first then
        return nil
    end
    -- The member that starts at or last before `seq`; a few more only if
    -- its id there is not the visitor's (more than one member can start
    -- at a seq after a lost last_seq, or a place put back inside one).
    local from, n = '0', '1'
    while true do
        local found = redis.call('ZRANGE', c.k.tail, seq_s, '-inf', 'BYSCORE', 'REV', 'LIMIT', from, n)
        for _, m in ipairs(found) do
            local t = tail_member(m)
            local i = seq - t.first
            if i < t.k and tail_ids(c, t, i, 1) == visitor then
                return t
            end
        end
        if from ~= '0' or #found == 0 then
            return nil
        end
        from, n = '1', '3'
    end
end

-- Looks for the visitors of the set `wanted` (visitor -> true) among the
-- tail's members `from` .. `from` + TAIL_SCAN - 1 (0-based, in seq order;
-- negative: counted from the newest, -TAIL_SCAN being the TAIL_SCAN
-- newest): returns the seqs found (visitor -> seq) and where the next call
-- starts (nil: the tail has no more members, or the read was from the
-- newest). One call reads at most TAIL_SCAN members, whatever the queue.
local function tail_scan(c, wanted, from)
    local found = {}
    local ms = redis.call('ZRANGE', c.k.tail, int(from), int(from + TAIL_SCAN - 1))
    for _, m in ipairs(ms) do
        local t = tail_member(m)
        local ids = tail_ids(c, t, 0, t.k)
        for i = 0, t.k - 1 do
            local id = string.sub(ids, ID_LEN * i + 1, ID_LEN * (i + 1))
            if wanted[id] then
                found[id] = t.first + i
            end
        end
    end
    if from < 0 or #ms < TAIL_SCAN then
        return found, nil
    end
    return found, from + TAIL_SCAN
end

-- Notes the tail places of visitors who arrived by a stable id: `ids`
-- (k ids joined) at seqs first .. first + k - 1.
local function tail_seqs_add(c, first, k, ids)
    local args = {}
    for i = 0, k - 1 do
        args[2 * i + 1] = string.sub(ids, ID_LEN * i + 1, ID_LEN * (i + 1))
        args[2 * i + 2] = int(first + i)
    end
    redis.call('HSET', c.k.tail_seqs, unpack(args))
    redis.call('PEXPIRE', c.k.tail_seqs, c.p.key_ttl_ms)
end

-- The seqs noted for the visitors `ids` (a list), in order (false where
-- none is): where in the tail a stable id's place is, without reading it.
local function tail_seqs_of(c, ids)
    return redis.call('HMGET', c.k.tail_seqs, unpack(ids))
end

-- The place at `seq` in tail member `t` as a Queued verdict.
local function tail_place(c, t, seq)
    local ahead = redis.call('ZCARD', c.k.queue)
    local position = math.max(ahead + t.cum - c.tail_first.cum + seq - t.first + 1, 1)
    return { QUEUED, seq, position, math.max(ahead + tail_length(c), position) }
end

-- The seq of the place at `rank` (0-based) in the tail, or nil. `hint`
-- (optional, a table kept by the caller between calls with ranks that do
-- not decrease) starts the search where the last one ended.
local function tail_seq_at(c, rank, hint)
    local first, last = tail_ends(c)
    if not first then
        return nil
    end
    local want = first.cum + rank
    if want >= last.stop then
        return nil
    end
    -- The last member whose cum is at most `want`: lo's cum <= want < hi's
    -- (hi = the member count: the end). Batches are of similar sizes, so
    -- interpolating finds it in a step or two; halving after four steps
    -- bounds the rest.
    if hint and not hint.n then
        hint.n = redis.call('ZCARD', c.k.tail)
    end
    local lo, lo_t = 0, first
    local hi = hint and hint.n or redis.call('ZCARD', c.k.tail)
    local hi_cum = last.stop
    if hint and hint.t and hint.t.cum <= want then
        lo, lo_t = hint.i, hint.t
    end
    local steps = 0
    while hi - lo > 1 do
        steps = steps + 1
        local mid
        if steps <= 4 then
            mid = lo + math.floor((want - lo_t.cum) * (hi - lo) / (hi_cum - lo_t.cum))
            mid = math.max(lo + 1, math.min(hi - 1, mid))
        else
            mid = math.floor((lo + hi) / 2)
        end
        local at = int(mid)
        local t = tail_member(redis.call('ZRANGE', c.k.tail, at, at)[1])
        if t.cum <= want then
            lo, lo_t = mid, t
        else
            hi, hi_cum = mid, t.cum
        end
    end
    if hint then
        hint.i, hint.t = lo, lo_t
    end
    return lo_t.first + math.min(want - lo_t.cum, lo_t.k - 1)
end

-- The seq of the place at `rank` (0-based) in the whole queue, or nil
-- (`hint` as for tail_seq_at).
local function seq_at(c, rank, hint)
    local in_queue = hint and hint.q or redis.call('ZCARD', c.k.queue)
    if hint then
        hint.q = in_queue
    end
    if rank < in_queue then
        local at = int(rank)
        local e = redis.call('ZRANGE', c.k.queue, at, at, 'WITHSCORES')
        return tonumber(e[2])
    end
    return tail_seq_at(c, rank - in_queue, hint)
end

-- Moves whole members from the tail's front into `queue` until `want`
-- places have moved or the tail is empty; leaves out (and counts) who
-- left while in the tail. Members that start inside the seqs already moved
-- (a place put back there) go too, so every seq left in the tail stays
-- above every seq in `queue` (H2). Returns how many places moved.
local function refill(c, want)
    local moved = 0
    local floor = nil
    -- The ids the moved members had (their chunks go once passed).
    local ids_lo, ids_hi = nil, nil
    -- The highest seq moved so far.
    local moved_to = nil
    while true do
        local front = redis.call('ZRANGE', c.k.tail, '0', '0')
        if #front == 0 then
            break
        end
        local t = tail_member(front[1])
        if moved >= want and not (moved_to and t.first <= moved_to) then
            break
        end
        moved_to = math.max(moved_to or 0, t.first + t.k - 1)
        floor = floor or tonumber(redis.call('HGET', c.k.meta, 'reset_floor') or '0')
        local joined = tail_ids(c, t, 0, t.k)
        -- Places whose ids a chunk lost come back when they poll (I5).
        local ids, seqs = {}, {}
        for i = 0, t.k - 1 do
            local id = string.sub(joined, ID_LEN * i + 1, ID_LEN * (i + 1))
            if is_id(id) then
                ids[#ids + 1] = id
                seqs[#ids] = t.first + i
            end
        end
        local stay, left_ids = {}, {}
        if #ids > 0 then
            -- (Who left the tail has a `places` mark, or a session if
            -- passthrough let it in; an `ended` mark is an earlier
            -- session's, of a visitor who came back by id to this place.)
            local sessions = redis.call('ZMSCORE', c.k.sessions, unpack(ids))
            local places = redis.call('ZMSCORE', c.k.places, unpack(ids))
            for i, id in ipairs(ids) do
                local seq = seqs[i]
                local left = seq <= floor or sessions[i]
                    or (places[i] and tonumber(places[i]) > c.now)
                if left then
                    left_ids[#left_ids + 1] = id
                else
                    stay[#stay + 1] = id
                    stay[#stay + 1] = seq
                end
            end
        end
        if #left_ids > 0 then
            redis.call('HDEL', c.k.polls, unpack(left_ids))
        end
        if #ids > 0 then
            if c.has_tail_seqs == nil then
                c.has_tail_seqs = redis.call('EXISTS', c.k.tail_seqs) == 1
            end
            if c.has_tail_seqs then
                -- (In `queue` now, or gone: found by id there.)
                redis.call('HDEL', c.k.tail_seqs, unpack(ids))
            end
        end
        local gone, keep = gone_of(c, stay)
        drop(c, gone)
        if #keep > 0 then
            -- gone_of keeps the order: `stay` pairs for the kept, in order.
            local args, j = {}, 1
            local is_gone = {}
            for _, v in ipairs(gone) do
                is_gone[v] = true
            end
            for i = 1, #stay, 2 do
                if not is_gone[stay[i]] then
                    args[j], args[j + 1] = int(stay[i + 1]), stay[i]
                    j = j + 2
                end
            end
            zadd_all(c.k.queue, args, #args)
        end
        redis.call('ZREM', c.k.tail, t.m)
        if t.off then
            ids_lo, ids_hi = ids_lo or t.off, t.off + t.k
        end
        moved = moved + t.k
    end
    if moved > 0 then
        tail_changed(c)
        if ids_lo then
            -- Every chunk the moved ids passed, and the last one too if the
            -- tail is now empty (its numbers start again at 0).
            local hi = ids_hi - ids_hi % CHUNK
            if not tail_ends(c) then
                hi = ids_hi
            end
            if hi > ids_lo then
                each_chunk(c, ids_lo, hi, function(key)
                    redis.call('DEL', key)
                end)
            end
        end
    end
    return moved
end

-- The ids chunks the tail's members point into, for `f` (every one,
-- whatever the queue's size).
local function each_tail_chunk(c, f)
    local first = tail_ends(c)
    if first then
        local hi = ids_end(c)
        local lo = first.off or math.max(hi - tail_length(c), 0)
        if hi > lo then
            each_chunk(c, lo, hi, f)
        end
    end
end

-- Keeps `queue` at HEAD_WINDOW / 2 places at least while the tail has more,
-- so polls near the head read exact positions.
local function refill_head(c)
    if tail_ends(c) then
        local short = HEAD_WINDOW / 2 - redis.call('ZCARD', c.k.queue)
        if short > 0 then
            refill(c, math.min(short, PROMOTE_MAX))
        end
    end
end

-- The visitor's place in `queue` as a Queued verdict, or nil.
local function place_of(c, visitor)
    local seq = redis.call('ZSCORE', c.k.queue, visitor)
    if not seq then
        return nil
    end
    local rank = redis.call('ZRANK', c.k.queue, visitor)
    return { QUEUED, tonumber(seq), rank + 1, queue_length(c) }
end
