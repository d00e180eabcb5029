-- Prelude of the global region scripts (region_sync, region_anywhere):
-- the codec of one region's record in wrg:{room}:regions. The Rust side
-- concatenates it in front of each (room scripts get lua/lib/*.lua as a
-- function library instead: library.rs).
-- It also reads the arguments every one of them starts with
-- (`Region::global_call`): KEYS[1] the room's regions hash, ARGV[1] now
-- (ms), ARGV[2] this region, ARGV[3] the room's limit, ARGV[4] the lease.
local K = KEYS[1]
local now = tonumber(ARGV[1])
local me_name = ARGV[2]
local limit = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])

-- One region's record: "raised returned active queued head traffic at
-- anywhere samples rraised rreturned window since recent reported"
-- (integers but traffic; samples "rank:seq,..."; not JSON, whose numbers
-- keep only 14 digits and a seq has 15). rraised and rreturned are the
-- admission-token totals, kept like raised and returned (docs/regions.md,
-- I2). since: the region's first report (0 in records written before it
-- was kept); recent: its arrivals in the interval before its last report;
-- reported: its `anywhere` total at its last report (the Anywhere slots
-- it took since are anywhere - reported). A record missing the last
-- fields reads them as 0.
local FIELDS = { 'raised', 'returned', 'active', 'queued', 'head', 'traffic', 'at', 'anywhere',
    'samples', 'rraised', 'rreturned', 'window', 'since', 'recent', 'reported' }
local function decode(text)
    local r, i = {}, 1
    r.samples = {}
    for word in string.gmatch(text, '%S+') do
        if FIELDS[i] == 'samples' then
            for rank, seq in string.gmatch(word, '(%d+):(%d+)') do
                r.samples[#r.samples + 1] = { tonumber(rank), tonumber(seq) }
            end
        elseif FIELDS[i] then
            r[FIELDS[i]] = tonumber(word) or 0
        end
        i = i + 1
    end
    for _, f in ipairs(FIELDS) do
        r[f] = r[f] or 0
    end
    return r
end
local function encode(r)
    local parts = {}
    for i, p in ipairs(r.samples or {}) do
        parts[i] = string.format('%d:%d', p[1], p[2])
    end
    local samples = table.concat(parts, ',')
    if samples == '' then
        samples = '-'
    end
    return string.format('%d %d %d %d %d %.3f %d %d %s %d %d %d %d %d %d', r.raised,
        r.returned, r.active, r.queued, r.head, r.traffic, r.at, r.anywhere, samples, r.rraised,
        r.rreturned, r.window, r.since, r.recent, r.reported)
end
