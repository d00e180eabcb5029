-- set_overrides: replaces (ARGV[1] = JSON, ARGV[2] = its revision) or,
-- with no ARGV, clears the operator's runtime changes to a room.
-- KEYS[1] = the room's overrides key, KEYS[2] = its meta hash, where the
-- revision is kept for the room functions (`lib/ctx.lua`: a call that
-- carries an older one is refused, STALE, and asked again).
-- No expiry: changes stay until an operator or a new config file drops them.
if #ARGV == 0 then
    redis.call('HDEL', KEYS[2], 'o_rev')
    return redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[2], 'o_rev', ARGV[2])
return redis.call('SET', KEYS[1], ARGV[1])
