-- totals: cumulative counters of a room. KEYS[1] = meta hash.
-- Returns {admitted, queued, rejected, abandoned}.
local v = redis.call('HMGET', KEYS[1], 'admitted', 'queued', 'rejected', 'abandoned')
return { tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0, tonumber(v[4]) or 0 }
