-- check: verifies the room's cross-key invariants as the keys stand (the
-- ones each lib file names in its header) and returns what is violated,
-- one sentence each (empty: none). Writes nothing, but for the layout
-- mark begin() gives an unmarked room.
--
-- The lib helpers it calls (lua/lib/*.lua; library.rs checks the list):
-- uses: admissions, each_chunk, int, lane_key, tail_member
local k = c.k
local out = {}
local function violated(what)
    out[#out + 1] = what
end

-- B1, B2: the batched count and the LEFT marks.
local all = redis.call('ZRANGE', k.batches, 0, -1, 'WITHSCORES')
local ids, lefts, counted = {}, {}, nil
local n_ids = 0
for i = 1, #all, 2 do
    local m, score = all[i], all[i + 1]
    if m == BATCHED then
        counted = -tonumber(score)
    elseif string.sub(m, 1, 1) == LEFT then
        lefts[string.sub(m, 2)] = score
    else
        if #m % ID_LEN ~= 0 then
            violated('a batch member is not whole ids: ' .. #m .. ' bytes')
        end
        for at = 1, #m, ID_LEN do
            local id = string.sub(m, at, at + ID_LEN - 1)
            if ids[id] then
                violated('id ' .. id .. ' is in two batches')
            end
            ids[id] = score
            n_ids = n_ids + 1
        end
    end
end
local n_left = 0
for id, score in pairs(lefts) do
    n_left = n_left + 1
    local batch = ids[id]
    if not batch then
        violated('LEFT mark of ' .. id .. ' names no batch')
    elseif tonumber(score) + 0.5 ~= tonumber(batch) then
        violated('LEFT mark of ' .. id .. ' at ' .. score .. ' is not half a ms below its batch ' .. batch)
    end
end
if #all > 0 and counted == nil then
    violated('batches has members but no count member')
end
if counted and counted ~= n_ids - n_left then
    violated('the batched count says ' .. counted .. ', the batches hold ' .. (n_ids - n_left))
end
-- B2: a batched session that has not left is not also one of its own.
local singles = redis.call('ZRANGE', k.sessions, 0, -1)
for _, v in ipairs(singles) do
    if ids[v] and not lefts[v] then
        violated(v .. ' has a session of its own and one in a batch')
    end
end

-- W1: the window's count.
local window = tonumber(redis.call('HGET', k.meta, 'window') or '0')
local in_window = admissions(redis.call('ZRANGE', k.admits, 0, -1))
if window ~= in_window then
    violated('meta window says ' .. window .. ', the admits hold ' .. in_window)
end

-- H1, H2, T1-T4: the queue's order, the tail's members and chunks.
local meta = redis.call('HMGET', k.meta, 'last_seq', 'reset_floor', 'layout')
local last_seq = tonumber(meta[1] or '0')
local floor = tonumber(meta[2] or '0')
local mark = tonumber(meta[3] or '')
if redis.call('EXISTS', k.meta) == 1 and not (mark and mark >= LAYOUT_VERSION and mark <= LAYOUT_NEWEST) then
    violated('meta layout is ' .. tostring(meta[3]) .. ', not ' .. LAYOUT_VERSION_S)
end
local head = redis.call('ZRANGE', k.queue, 0, -1, 'WITHSCORES')
local head_max = nil
for i = 2, #head, 2 do
    local seq = tonumber(head[i])
    if seq <= floor then
        violated('a place in queue at ' .. head[i] .. ' is at or below the reset floor ' .. int(floor))
    end
    head_max = math.max(head_max or seq, seq)
end
local members = redis.call('ZRANGE', k.tail, 0, -1, 'WITHSCORES')
local prev = nil
local tail_max = nil
local first_off, end_off = nil, nil
for i = 1, #members, 2 do
    local t = tail_member(members[i])
    if tonumber(members[i + 1]) ~= t.first then
        violated('a tail member is scored ' .. members[i + 1] .. ' but starts at ' .. int(t.first))
    end
    if t.first <= floor then
        violated('a tail member starts at ' .. int(t.first) .. ', at or below the reset floor')
    end
    tail_max = math.max(tail_max or 0, t.first + t.k - 1)
    if head_max and i == 1 and head_max >= t.first then
        violated('queue holds seq ' .. int(head_max) .. ', not below the tail\'s first ' .. int(t.first))
    end
    if not t.inline then
        if prev then
            -- (Greater when a place put back between them extended the
            -- tail's end: counted too many, never too few.)
            if t.cum < prev.cum + prev.k then
                violated('a tail member at ' .. int(t.first) .. ' has cum ' .. int(t.cum)
                    .. ', not ' .. int(prev.cum + prev.k))
            end
            if t.off ~= prev.off + prev.k then
                violated('a tail member at ' .. int(t.first) .. ' has its ids at ' .. int(t.off)
                    .. ', not ' .. int(prev.off + prev.k))
            end
        end
        prev = t
        first_off = first_off or t.off
        end_off = t.off + t.k
    end
end
if first_off then
    each_chunk(c, first_off, end_off, function(key)
        local ttl = redis.call('PTTL', key)
        if ttl == -2 then
            violated('ids chunk ' .. key .. ' is missing')
        elseif ttl == -1 then
            violated('ids chunk ' .. key .. ' has no expiry')
        end
    end)
end
-- L1, L2: the lanes' seqs, and each visitor in one lane at most (the
-- general queue's head included).
local in_lane = {}
for i = 1, #head, 2 do
    in_lane[head[i]] = 0
end
for lane = 1, MAX_LANES do
    local places = redis.call('ZRANGE', lane_key(c, lane), 0, -1, 'WITHSCORES')
    for i = 1, #places, 2 do
        local seq = tonumber(places[i + 1])
        if seq <= floor or seq > last_seq then
            violated('lane ' .. lane .. ' holds seq ' .. places[i + 1] .. ', outside ('
                .. int(floor) .. ', ' .. int(last_seq) .. ']')
        end
        if in_lane[places[i]] then
            violated(places[i] .. ' waits in lanes ' .. in_lane[places[i]] .. ' and ' .. lane)
        end
        in_lane[places[i]] = lane
    end
end
local top = math.max(head_max or 0, tail_max or 0)
if top > last_seq then
    violated('a place has seq ' .. int(top) .. ', above meta last_seq ' .. int(last_seq))
end
return out
