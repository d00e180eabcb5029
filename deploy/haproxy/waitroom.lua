-- waitroom in decision mode behind HAProxy (2.6 or later): an action that
-- asks the daemon whether a request may pass, before HAProxy forwards it.
--
--     global
--         lua-load /etc/haproxy/waitroom.lua
--     frontend shop
--         http-request lua.waitroom 127.0.0.1:8080 unless { path_beg /__waitroom/ }
--         http-response add-header Set-Cookie %[var(txn.waitroom_cookie)] if { var(txn.waitroom_cookie) -m found }
--
-- (the daemon's visitor listener as the argument; HAProxy's address in
-- waitroom's `server.trusted_proxies`). See haproxy.cfg.example and
-- docs/behind-a-proxy.md.
--
-- Let in: the request goes on with X-Waitroom-Visitor, -Room and
-- -Signature set from the answer (every X-Waitroom-* header the visitor
-- sent is removed first, whatever its case, `_` for `-` too), and a
-- renewed ticket is kept in txn.waitroom_cookie for the response. Not let
-- in: the daemon's page (queue, 429, 503) is the answer, with the status
-- the daemon gives it. The daemon down or slow: 503, nothing passes.

-- Headers of the visitor's request that the decision does not need, or
-- that describe the request in a way only this action may.
local skipped = {
    ["host"] = true, ["content-length"] = true, ["transfer-encoding"] = true,
    ["connection"] = true, ["keep-alive"] = true, ["upgrade"] = true,
    ["te"] = true, ["expect"] = true,
    ["x-forwarded-for"] = true, ["x-forwarded-method"] = true,
    ["x-forwarded-uri"] = true, ["x-forwarded-host"] = true,
    ["x-forwarded-proto"] = true, ["x-original-uri"] = true,
    ["x-original-method"] = true,
}

-- The headers the origin gets from the decision.
local named = { "x-waitroom-visitor", "x-waitroom-room", "x-waitroom-signature" }

-- What the visitor gets with a page that is not the origin's.
local relayed = {
    "content-type", "content-language", "cache-control", "retry-after",
    "set-cookie", "vary", "location", "referrer-policy",
}

local function first(headers, name)
    local values = headers[name]
    if values == nil then
        return nil
    end
    return values[0]
end

local function ask(txn, daemon)
    local headers = {}
    for name, values in pairs(txn.http:req_get_headers()) do
        if not skipped[name] then
            local list = {}
            for _, v in pairs(values) do
                list[#list + 1] = v
            end
            headers[name] = list
        end
    end
    headers["x-forwarded-method"] = { txn.sf:method() }
    headers["x-forwarded-uri"] = { txn.sf:pathq() }
    headers["x-forwarded-host"] = { txn.sf:req_hdr("host") or "" }
    headers["x-forwarded-for"] = { txn.sf:src() }
    local client = core.httpclient()
    return client:get({
        url = "http://" .. daemon .. "/__waitroom/auth/forwarded",
        headers = headers,
        timeout = 2000,
    })
end

core.register_action("waitroom", { "http-req" }, function(txn, daemon)
    local ok, res = pcall(ask, txn, daemon)
    if not ok or res == nil or res.status == nil or res.status == 0 then
        local reply = txn:reply({
            status = 503,
            headers = { ["content-type"] = { "text/plain" }, ["retry-after"] = { "5" } },
            body = "The waiting room cannot be reached. Please try again shortly.\n",
        })
        txn:done(reply)
        return
    end
    if res.status == 200 then
        -- HAProxy hands header names over in lower case; origins that
        -- fold `_` into `-` read x_waitroom_* as ours too.
        for name, _ in pairs(txn.http:req_get_headers()) do
            if string.find(name, "^x[-_]waitroom[-_]") then
                txn.http:req_del_header(name)
            end
        end
        for _, name in ipairs(named) do
            local value = first(res.headers, name)
            if value ~= nil and value ~= "" then
                txn.http:req_set_header(name, value)
            end
        end
        local cookie = first(res.headers, "set-cookie")
        if cookie ~= nil and cookie ~= "" then
            txn:set_var("txn.waitroom_cookie", cookie)
        end
        return
    end
    local status = tonumber(first(res.headers, "x-waitroom-status") or "") or res.status
    local headers = {}
    for _, name in ipairs(relayed) do
        local value = first(res.headers, name)
        if value ~= nil then
            headers[name] = { value }
        end
    end
    txn:done(txn:reply({ status = status, headers = headers, body = res.body or "" }))
end, 1)
