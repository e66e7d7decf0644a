--[[
gpucredit job_submit.lua: ask the local `gpucredit daemon` whether a job may
be submitted, and tell the user what it will cost.

Runs inside slurmctld under its locks, before the job has an id or a
validated account (docs/slurm-facts.md §4), so it stays thin: copy
the raw job_desc fields into one JSON line, send it over the daemon's Unix
socket (luasocket, bounded by a short timeout), read one reply line, and
turn the decision into slurm.log_user + slurm.SUCCESS / slurm.ERROR. All
pricing and parsing happens in the daemon (job_submit/request.py). A job with
a cost limit or allowed to the cloud comes back routed (docs/routing.md): the
reply's partition list and comment are written into job_desc.

A Lua error inside slurm_job_submit makes Slurm ACCEPT the job, so every
step runs under pcall and any failure (no luasocket, daemon down, timeout,
garbled reply) follows the site policy baked in at install time.

`gpucredit slurm install` substitutes the @...@ placeholders below; left as
they are, the defaults apply (socket /run/gpucredit/daemon.sock, policy
reject, timeout 1.0 s).

Note: slurm.log_user/log_info/log_error are string.format wrappers, so
text we did not write is always passed as an argument to "%s".
--]]

local SOCKET_PATH = "@SOCKET@"     -- daemon sockets, primary first, separated by spaces
local POLICY = "@POLICY@"          -- on_ledger_unreachable: "reject" | "accept"
local TIMEOUT = "@TIMEOUT@"        -- seconds for the whole exchange

-- An unsubstituted placeholder still starts with "@". (Test the first
-- character, not equality with the placeholder text: the installer's
-- substitution would rewrite that text too.)
if SOCKET_PATH:sub(1, 1) == "@" or SOCKET_PATH == "" then
    SOCKET_PATH = "/run/gpucredit/daemon.sock"
end
-- Two controllers (daemon.sockets): every daemon is tried, primary first.
local SOCKETS = {}
for path in SOCKET_PATH:gmatch("%S+") do
    SOCKETS[#SOCKETS + 1] = path
end
if POLICY ~= "accept" then
    POLICY = "reject"    -- anything but an explicit "accept" fails closed
end
TIMEOUT = tonumber(TIMEOUT) or 1.0
if TIMEOUT <= 0 or TIMEOUT > 10 then
    TIMEOUT = 1.0
end

local UNAVAILABLE_MESSAGE = "gpucredit: credit check unavailable (ledger unreachable); "
    .. "job refused by site policy; try again shortly or contact your admin"
local UNCHECKED_MESSAGE = "gpucredit: credit check unavailable (ledger unreachable); "
    .. "job accepted by site policy, unquoted; it is charged once the ledger is back"

local SUCCESS = slurm.SUCCESS or 0
local ERROR = slurm.ERROR or -1

-- Loaded under pcall: a missing lua-socket must not stop slurmctld from
-- loading this script (it would refuse to start).
local socket, unix
do
    local ok_socket, socket_mod = pcall(require, "socket")
    local ok_unix, unix_mod = pcall(require, "socket.unix")
    if ok_socket and ok_unix then
        socket, unix = socket_mod, unix_mod
    end
end

-- The job_desc fields forwarded verbatim, in this order (nil ones omitted).
local FIELDS = {
    "user_name", "user_id", "account", "default_account", "partition",
    "tres_per_node", "tres_per_job", "tres_per_task", "time_limit",
    "num_tasks", "min_nodes", "array_inx", "comment", "shared",
}

-- Raise `message` without a "file:line:" prefix (it ends up in the log).
local function fail(message)
    error(message, 0)
end

---------------------------------------------------------------------------
-- JSON encoding (just what the request needs)

local ESCAPES = {
    ['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f',
    ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t',
}

-- Replace bytes that are not valid UTF-8 with U+FFFD: the daemon decodes
-- the request as UTF-8 and would reject the whole line otherwise.
local function valid_utf8(s)
    if not s:find("[\128-\255]") then
        return s
    end
    local out, i, n = {}, 1, #s
    while i <= n do
        local c = s:byte(i)
        local len = 0
        if c < 0x80 then
            len = 1
        elseif c >= 0xC2 and c <= 0xDF then
            len = 2
        elseif c >= 0xE0 and c <= 0xEF then
            len = 3
        elseif c >= 0xF0 and c <= 0xF4 then
            len = 4
        end
        local ok = len > 0 and i + len - 1 <= n
        if ok and len > 1 then
            local c2 = s:byte(i + 1)
            local lo, hi = 0x80, 0xBF
            if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F
            elseif c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
            ok = c2 >= lo and c2 <= hi
            for k = i + 2, i + len - 1 do
                local ck = s:byte(k)
                ok = ok and ck >= 0x80 and ck <= 0xBF
            end
        end
        if ok then
            out[#out + 1] = s:sub(i, i + len - 1)
            i = i + len
        else
            out[#out + 1] = "\239\191\189"
            i = i + 1
        end
    end
    return table.concat(out)
end

local function encode_string(s)
    if not s:find('[%c"\\\128-\255]') then
        return '"' .. s .. '"'    -- the usual name or GRES string: nothing to escape
    end
    local escaped = valid_utf8(s):gsub('[%c"\\]', function(c)
        return ESCAPES[c] or string.format("\\u%04x", c:byte())
    end)
    return '"' .. escaped .. '"'
end

local function encode_number(n)
    if n ~= n or n == math.huge or n == -math.huge then
        return "null"
    end
    if n == math.floor(n) and math.abs(n) < 2 ^ 53 then
        return string.format("%.0f", n)
    end
    return string.format("%.17g", n)
end

local function encode_scalar(v)
    local t = type(v)
    if t == "string" then
        return encode_string(v)
    elseif t == "number" then
        return encode_number(v)
    elseif t == "boolean" then
        return v and "true" or "false"
    end
    return nil   -- nil, or a type we do not forward
end

-- A function from a record to its `"key":value` parts: `keys` in the given order, nil
-- values left out. The record is read by name only (Slurm's records are userdata:
-- pairs() sees nothing), and the keys are encoded once, here.
local function object_encoder(keys)
    local prefixes = {}
    for i, key in ipairs(keys) do
        prefixes[i] = encode_string(key) .. ":"
    end
    return function(record)
        local parts = {}
        for i, key in ipairs(keys) do
            local encoded = encode_scalar(record[key])
            if encoded ~= nil then
                parts[#parts + 1] = prefixes[i] .. encoded
            end
        end
        return parts
    end
end

---------------------------------------------------------------------------
-- JSON decoding (a small, strict-enough recursive descent parser)

local decode_value

local SIMPLE_ESCAPES = {
    ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f',
    n = '\n', r = '\r', t = '\t',
}

local function utf8_char(cp)
    if cp < 0x80 then
        return string.char(cp)
    elseif cp < 0x800 then
        return string.char(0xC0 + math.floor(cp / 0x40), 0x80 + cp % 0x40)
    elseif cp < 0x10000 then
        return string.char(0xE0 + math.floor(cp / 0x1000),
            0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
    end
    return string.char(0xF0 + math.floor(cp / 0x40000),
        0x80 + math.floor(cp / 0x1000) % 0x40,
        0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
end

local function skip_space(s, i)
    return s:find("[^ \t\r\n]", i) or #s + 1
end

local function decode_string(s, i)
    -- s:sub(i, i) is the opening quote
    local parts, j = {}, i + 1
    while true do
        local k = s:find('["\\]', j)
        if not k then
            fail("unterminated string in reply")
        end
        parts[#parts + 1] = s:sub(j, k - 1)
        if s:sub(k, k) == '"' then
            return table.concat(parts), k + 1
        end
        local e = s:sub(k + 1, k + 1)
        if e == "u" then
            local hex = s:match("^%x%x%x%x", k + 2)
            if not hex then
                fail("bad \\u escape in reply")
            end
            local cp, next_i = tonumber(hex, 16), k + 6
            if cp >= 0xD800 and cp <= 0xDBFF then
                local low = s:match("^\\u(%x%x%x%x)", next_i)
                low = low and tonumber(low, 16)
                if low and low >= 0xDC00 and low <= 0xDFFF then
                    cp = 0x10000 + (cp - 0xD800) * 0x400 + (low - 0xDC00)
                    next_i = next_i + 6
                else
                    cp = 0xFFFD   -- lone high surrogate
                end
            elseif cp >= 0xDC00 and cp <= 0xDFFF then
                cp = 0xFFFD       -- lone low surrogate
            end
            parts[#parts + 1] = utf8_char(cp)
            j = next_i
        elseif SIMPLE_ESCAPES[e] then
            parts[#parts + 1] = SIMPLE_ESCAPES[e]
            j = k + 2
        else
            fail("bad escape in reply")
        end
    end
end

local function decode_object(s, i, depth)
    local object = {}
    i = skip_space(s, i + 1)
    if s:sub(i, i) == "}" then
        return object, i + 1
    end
    while true do
        if s:sub(i, i) ~= '"' then
            fail("expected a key in reply")
        end
        local key
        key, i = decode_string(s, i)
        i = skip_space(s, i)
        if s:sub(i, i) ~= ":" then
            fail("expected ':' in reply")
        end
        local value
        value, i = decode_value(s, skip_space(s, i + 1), depth + 1)
        object[key] = value
        i = skip_space(s, i)
        local c = s:sub(i, i)
        if c == "}" then
            return object, i + 1
        elseif c ~= "," then
            fail("expected ',' or '}' in reply")
        end
        i = skip_space(s, i + 1)
    end
end

local function decode_array(s, i, depth)
    local array = {}
    i = skip_space(s, i + 1)
    if s:sub(i, i) == "]" then
        return array, i + 1
    end
    while true do
        local value
        value, i = decode_value(s, i, depth + 1)
        array[#array + 1] = value
        i = skip_space(s, i)
        local c = s:sub(i, i)
        if c == "]" then
            return array, i + 1
        elseif c ~= "," then
            fail("expected ',' or ']' in reply")
        end
        i = skip_space(s, i + 1)
    end
end

decode_value = function(s, i, depth)
    if depth > 32 then
        fail("reply nested too deeply")
    end
    i = skip_space(s, i)
    local c = s:sub(i, i)
    if c == "{" then
        return decode_object(s, i, depth)
    elseif c == "[" then
        return decode_array(s, i, depth)
    elseif c == '"' then
        return decode_string(s, i)
    elseif s:sub(i, i + 3) == "true" then
        return true, i + 4
    elseif s:sub(i, i + 4) == "false" then
        return false, i + 5
    elseif s:sub(i, i + 3) == "null" then
        return nil, i + 4
    end
    local number = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", i)
    if number and tonumber(number) then
        return tonumber(number), i + #number
    end
    fail("unexpected character in reply at " .. i)
end

local function decode(s)
    local value, i = decode_value(s, 1, 0)
    if skip_space(s, i) <= #s then
        fail("trailing data in reply")
    end
    return value
end

---------------------------------------------------------------------------
-- The request

local encode_job = object_encoder(FIELDS)
local encode_partition = object_encoder({ "default_time", "max_time" })

local function build_request(job_desc, part_list)
    local parts = encode_job(job_desc)
    table.insert(parts, 1, '"op":"submit"')
    -- part_list is a real table (pairs works); its entries are userdata.
    local partitions = {}
    if type(part_list) == "table" then
        local names = {}
        for name in pairs(part_list) do
            if type(name) == "string" then
                names[#names + 1] = name
            end
        end
        table.sort(names)
        for _, name in ipairs(names) do
            local part = part_list[name]
            local fields = encode_partition(part)
            local flag = part.flag_default
            if flag ~= nil then
                fields[#fields + 1] = '"default":' .. ((flag == true or flag == 1) and "true" or "false")
            end
            partitions[#partitions + 1] = encode_string(name) .. ":{" .. table.concat(fields, ",") .. "}"
        end
    end
    parts[#parts + 1] = '"partitions":{' .. table.concat(partitions, ",") .. "}"
    return "{" .. table.concat(parts, ",") .. "}\n"
end

---------------------------------------------------------------------------
-- The exchange: one request line out, one reply line back, within TIMEOUT.
--
-- The connection to each daemon is kept open between submissions (slurmctld keeps this
-- script's Lua state, and calls it under one lock): no socket, connect and accept per
-- job. Only a connection whose exchange completed is kept, so a late or partial reply
-- can never be read as the next job's answer. The daemon closes a connection idle for
-- 30 s, and a restarted daemon has closed them all: a kept connection found closed (the
-- send refused, or closed with nothing read back) is replaced by a new one within the
-- same deadline, once. A quote changes nothing, so asking again is safe.

local KEPT = {}    -- daemon socket path -> its open connection

-- Returns the reply line, or nil, why and whether the daemon had hung up unasked.
local function exchange(sock, path, line, remaining)
    -- "t": a total limit per call, refreshed from the one deadline.
    local sent = 0
    while sent < #line do
        sock:settimeout(remaining(), "t")
        local last, send_err, partial = sock:send(line, sent + 1)
        if not last then
            if partial and partial > sent then
                sent = partial
            else
                return nil, "send to " .. path .. " failed: " .. tostring(send_err),
                    send_err == "closed" and sent == 0
            end
        else
            sent = last
        end
    end
    sock:settimeout(remaining(), "t")
    local reply, recv_err, partial = sock:receive("*l")
    if not reply then
        if recv_err == "closed" and partial and partial ~= "" then
            return partial, nil, false    -- the daemon closed right after its line
        end
        -- Closed with nothing read back: the daemon hung up without answering.
        return nil, "no reply from " .. path .. ": " .. tostring(recv_err), recv_err == "closed"
    end
    return reply, nil, false
end

local function connect(path, remaining)
    local sock = assert((unix.stream or unix)())
    sock:settimeout(remaining(), "t")
    local connected, err = sock:connect(path)
    if not connected then
        sock:close()
        fail("cannot connect to " .. path .. ": " .. tostring(err))
    end
    return sock
end

local function ask_one(path, line, deadline)
    local function remaining()
        local left = deadline - socket.gettime()
        if left <= 0 then
            fail("timeout talking to " .. path)
        end
        return left
    end
    local sock = KEPT[path]
    KEPT[path] = nil
    local reused = sock ~= nil
    local ok, reply, why, hung_up = pcall(function()
        sock = sock or connect(path, remaining)
        return exchange(sock, path, line, remaining)
    end)
    if ok and not reply and reused and hung_up then
        sock:close()
        sock = nil
        ok, reply, why = pcall(function()
            sock = connect(path, remaining)
            return exchange(sock, path, line, remaining)
        end)
    end
    if ok and reply then
        KEPT[path] = sock
        return reply
    end
    if sock then
        sock:close()
    end
    error(ok and why or reply, 0)
end

-- Each daemon in turn within the one TIMEOUT, each try getting an equal share of the
-- time left (a hanging primary still leaves the backup its share). A missing, refused,
-- hanging or garbled daemon, or one saying it is "unavailable" (its database is down),
-- passes the request on; any other answer is final. Returns the decoded reply.
local function ask_daemon(line)
    if not unix then
        fail("luasocket (socket.unix) is not available")
    end
    local deadline = socket.gettime() + TIMEOUT
    local why
    for i, path in ipairs(SOCKETS) do
        local share = (deadline - socket.gettime()) / (#SOCKETS - i + 1)
        local ok, reply = pcall(function()
            return decode(ask_one(path, line, socket.gettime() + share))
        end)
        local e = ok and type(reply) == "table" and reply.ok ~= true and type(reply.error) == "table"
            and reply.error or nil
        if ok and not (e and e.code == "unavailable") then
            return reply
        end
        why = e and ("daemon error unavailable: " .. tostring(e.message)) or tostring(reply)
    end
    fail(why)
end

---------------------------------------------------------------------------
-- Slurm entry points

-- A routed job: the partitions it may run in (Slurm starts it in the first
-- that can, by PriorityTier) and the decision, ahead of the user's own text,
-- in its comment; cloud partitions held back for a while are named in its
-- AdminComment, which users cannot edit, for the daemon's burst pass. All are
-- checked before any is written.
local function apply_route(job_desc, result)
    local partition, comment, admin_comment = result.partition, result.comment, result.admin_comment
    if (partition ~= nil and type(partition) ~= "string")
        or (comment ~= nil and type(comment) ~= "string")
        or (admin_comment ~= nil and type(admin_comment) ~= "string") then
        fail("garbled reply: partition, comment or admin_comment is not a string")
    end
    if partition ~= nil and partition ~= "" then
        job_desc.partition = partition
    end
    if comment ~= nil then
        job_desc.comment = comment
        slurm.log_info("gpucredit: user %s: %s", tostring(job_desc.user_name), comment)
    end
    if admin_comment ~= nil then
        job_desc.admin_comment = admin_comment
    end
end

local function check_job(job_desc, part_list)
    local reply = ask_daemon(build_request(job_desc, part_list))
    if type(reply) ~= "table" then
        fail("garbled reply: not an object")
    end
    if reply.ok ~= true then
        local e = type(reply.error) == "table" and reply.error or {}
        fail("daemon error " .. tostring(e.code) .. ": " .. tostring(e.message))
    end
    local result = type(reply.result) == "table" and reply.result or {}
    local message = result.message
    if type(message) ~= "string" then
        message = ""
    end
    if result.decision == "reject" then
        if message == "" then
            message = "gpucredit: job refused"
        end
        slurm.log_info("gpucredit: user %s: refused: %s",
            tostring(job_desc.user_name), message)
        slurm.log_user("%s", message)
        return ERROR
    elseif result.decision == "accept" then
        apply_route(job_desc, result)
        if message ~= "" then
            slurm.log_user("%s", message)
        end
        return SUCCESS
    end
    fail("garbled reply: decision " .. tostring(result.decision))
end

local function on_failure(why)
    why = tostring(why)
    if POLICY == "accept" then
        -- Nothing here may block or reserve: PrologSlurmctld counts the job against its
        -- account's and the fleet's outage credit lines once it is allocated, and holds
        -- it with a reason past a line (docs/outage.md).
        pcall(slurm.log_info, "gpucredit: credit check failed (%s); job accepted by site policy", why)
        pcall(slurm.log_user, "%s", UNCHECKED_MESSAGE)  -- the user is told it was not checked
        return SUCCESS
    end
    pcall(slurm.log_error, "gpucredit: credit check failed (%s); job refused by site policy", why)
    pcall(slurm.log_user, "%s", UNAVAILABLE_MESSAGE)
    return ERROR
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    local ok, rc = pcall(check_job, job_desc, part_list)
    if ok then
        return rc
    end
    return on_failure(rc)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return SUCCESS
end

return SUCCESS
