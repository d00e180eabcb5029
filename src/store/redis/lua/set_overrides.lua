-- set_overrides: replaces (ARGV[1] = JSON) or, with no ARGV, clears the
-- operator's runtime changes to a room. KEYS[1] = the room's overrides key.
-- No expiry: changes stay until an operator or a new config file drops them.
if #ARGV == 0 then
    return redis.call('DEL', KEYS[1])
end
return redis.call('SET', KEYS[1], ARGV[1])
