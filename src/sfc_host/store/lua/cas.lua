-- Compare-and-set of many jobs, grouped by scope. On Redis Cluster the host sends one
-- group per call (every key of a scope shares its hash tag, so a call touches one
-- slot); on a single Redis one call may carry the groups of many scopes.
-- KEYS: the groups' offset keys first (KEYS[g] is group g's), then every other key the
-- groups name, by index.
-- ARGV[1] = number of groups; ARGV[2] = the latest server time (ms) at which these
-- decisions may still be written ('0': any time): a host frozen between reading a job
-- and this call decided on a clock from before a possible outage, so nothing is
-- written (every record loses, and the host reads the jobs again); ARGV[3], ARGV[4],
-- ARGV[5] = the consumer group, consumer and count that new entries are delivered to
-- (ignored when no group delivers); then per group:
--   due index key index, active set key index, work stream key index,
--   deliver ('1': its new entries are delivered, '0': not),
--   number of records, then each record:
--     job key index, job id, expected version ('0': the job must not exist),
--     state ('' = keep: an index-only record), fingerprint ('' = keep),
--     graph key index (0 = none), graph bytes (stored once, SET NX),
--     reset ('1' = drop every field first: a re-stored job id),
--     due ('' = off the index, else the score: deadline minus the offset the state is
--     shifted to), that offset (a record with a state loses when the scope's offset
--     is another: an outage was recorded after the job was read, so its state has not
--     seen the gap), active ('1' add, '0' remove, '' leave),
--     n wait ops, then per op: sign ('+' or '-'), waits key index, score,
--     n entries, then per entry: kind, action, command id,
--     response key index (0 = none), response value, the scope's results set key
--     index (the job joins it with its response: the state index's has_result), the
--     scope's MES outbox key index (0 = none: the job is stamped there with the
--     response, as order.lua stamps an order change),
--     archive records to append ('' = none; written with a state as the job's next
--     archive piece h:{hn + 1} (hn: the last one's number), merged with the pieces
--     before it every ARCHIVE_MERGE pieces; the archive is the h: fields joined in the
--     order of their numbers),
--     the job's trace context ('' = keep: written as field t with a state, by the
--     start that brings it from the job order).
-- A record whose version does not match writes nothing; the others still apply.
-- After every group's records, the new entries of the delivering groups' streams
-- (those just appended among them) are delivered to that consumer with one
-- XREADGROUP over all those streams: the host that made a command sends it without
-- reading the stream or the job again, and every entry still has exactly one owner.
-- The count of that read is ARGV[5] plus the most entries appended to one of those
-- streams: up to ARGV[5] older undelivered entries ahead of them come along.
-- The offsets are read first, in the one call: with one job a scope, a round trip
-- per scope would be most of the work.
-- Returns {versions, markers, counts, delivered}, flat over the groups (one reply
-- array per group would be most of the reply with one job a scope): versions, per
-- record in order, the new version (0: lost race); markers, per dispatch entry
-- written, in order, the entry id and the current values of the action's markers
-- sent:{action} and sent:{action}:hold (false when unset); counts, per group the
-- number of its dispatch entries in markers; delivered, the XREADGROUP reply
-- ({stream, entries} per stream with new entries; false when none).
local ARCHIVE_MERGE = 32
local versions, marks, counts = {}, {}, {}
local t = redis.call('TIME')
local too_late = false
if tonumber(ARGV[2]) > 0 then
  too_late = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[2])
end
-- A new version is the server clock in microseconds (at least one above the old): a
-- crash or failover that loses writes takes a job back to an older version, and the
-- versions it lost are never given out again, so a state a host kept from a lost write
-- cannot win a compare-and-set. (Below 2^53: exact in Lua's doubles.)
local clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ngroups = tonumber(ARGV[1])
local offsets = {}
-- GET, not MGET: the least-privilege ACL (docs/operations.md) grants GET, and inside
-- the script a call costs no round trip
for i = 1, ngroups do offsets[i] = redis.call('GET', KEYS[i]) or '0' end
local streams = {}           -- the delivering groups' work streams
local most = 0               -- the most entries appended to one delivering stream
local p = 6
for g = 1, ngroups do
  local due_key = KEYS[tonumber(ARGV[p])]
  local active_key = KEYS[tonumber(ARGV[p + 1])]
  local work_key = KEYS[tonumber(ARGV[p + 2])]
  local offset = offsets[g]
  local delivers = ARGV[p + 3] == '1'
  if delivers then streams[#streams + 1] = work_key end
  local appended = 0
  local n = tonumber(ARGV[p + 4])
  p = p + 5
  local nmarks = #marks
  for r = 1, n do
    local key = KEYS[tonumber(ARGV[p])]
    local job = ARGV[p + 1]
    local expected = ARGV[p + 2]
    local state = ARGV[p + 3]
    local fp = ARGV[p + 4]
    local gidx = tonumber(ARGV[p + 5])
    local gbytes = ARGV[p + 6]
    local reset = ARGV[p + 7]
    local due = ARGV[p + 8]
    local roffset = ARGV[p + 9]
    local active = ARGV[p + 10]
    local nw = tonumber(ARGV[p + 11])
    local w = p + 12
    local ne = tonumber(ARGV[w + 3 * nw])
    local e = w + 3 * nw + 1
    local ridx = tonumber(ARGV[e + 3 * ne])
    local rval = ARGV[e + 3 * ne + 1]
    local xidx = tonumber(ARGV[e + 3 * ne + 2])
    local oidx = tonumber(ARGV[e + 3 * ne + 3])
    local archive = ARGV[e + 3 * ne + 4]
    local trace = ARGV[e + 3 * ne + 5]
    p = e + 3 * ne + 6
    -- The version, the archive's last piece number and the markers of the record's
    -- first dispatch entry: one call (nothing below writes a marker; a reset deletes
    -- them, so then they are read after it)
    local first, pre = nil, nil
    if reset ~= '1' then
      for i = 0, ne - 1 do
        if string.sub(ARGV[e + 3 * i], 1, 9) == 'dispatch:' then first = i break end
      end
    end
    if first then
      local a = ARGV[e + 3 * first + 1]
      pre = redis.call('HMGET', key, 'v', 'hn', 'sent:' .. a, 'sent:' .. a .. ':hold')
    else
      pre = redis.call('HMGET', key, 'v', 'hn')
    end
    local current = pre[1] or '0'
    if too_late or current ~= expected or (state ~= '' and roffset ~= offset) then
      versions[#versions + 1] = 0
    else
      local v = math.max(tonumber(current) + 1, clock_us)
      if state ~= '' then
        if reset == '1' then redis.call('DEL', key) end
        -- every field of the record in one HSET
        local f = {'s', state, 'v', string.format('%d', v)}
        if fp ~= '' then f[#f + 1] = 'g' f[#f + 1] = fp end
        if offset ~= '0' then f[#f + 1] = 'o' f[#f + 1] = offset end
        if trace ~= '' then f[#f + 1] = 't' f[#f + 1] = trace end
        -- Settled records of the state (no event reads or rewrites them again) go to a
        -- field of their own, h:{hn + 1}, without reading what is stored: Redis's Lua
        -- hashes every byte of every string it makes, so reading and rewriting a chunk
        -- to append to it cost more than the rest of the record. Every ARCHIVE_MERGE-th
        -- piece merges the pieces since the last merge into its own field, so a job
        -- has at most hn / ARCHIVE_MERGE + ARCHIVE_MERGE of them. Readers join the h:
        -- fields in the order of their numbers (gaps allowed).
        if archive ~= '' then
          local hn = (reset == '1' and 0 or tonumber(pre[2] or '0')) + 1
          f[#f + 1] = 'hn'
          f[#f + 1] = hn
          f[#f + 1] = 'h:' .. hn
          if hn % ARCHIVE_MERGE == 0 then
            local names = {}
            for i = hn - ARCHIVE_MERGE + 1, hn - 1 do names[#names + 1] = 'h:' .. i end
            local got = redis.call('HMGET', key, unpack(names))
            local parts = {}
            for i = 1, #got do
              if got[i] then parts[#parts + 1] = got[i] end
            end
            parts[#parts + 1] = archive
            f[#f + 1] = table.concat(parts)
            redis.call('HDEL', key, unpack(names))
          else
            f[#f + 1] = archive
          end
        end
        redis.call('HSET', key, unpack(f))
        if gidx > 0 then redis.call('SET', KEYS[gidx], gbytes, 'NX') end
      else
        v = tonumber(current)
      end
      if due == '' then
        redis.call('ZREM', due_key, job)
      else
        redis.call('ZADD', due_key, due, job)
      end
      if active == '1' then
        redis.call('SADD', active_key, job)
      elseif active == '0' then
        redis.call('SREM', active_key, job)
      end
      for i = 0, nw - 1 do
        local q = w + 3 * i
        if ARGV[q] == '+' then
          redis.call('ZADD', KEYS[tonumber(ARGV[q + 1])], 'NX', ARGV[q + 2], job)
        else
          redis.call('ZREM', KEYS[tonumber(ARGV[q + 1])], job)
        end
      end
      appended = appended + ne
      for i = 0, ne - 1 do
        local q = e + 3 * i
        local id = redis.call('XADD', work_key, '*', 'k', ARGV[q], 'j', job, 'a', ARGV[q + 1],
                              'c', ARGV[q + 2])
        if i == first then
          marks[#marks + 1] = id
          marks[#marks + 1] = pre[3]
          marks[#marks + 1] = pre[4]
        elseif string.sub(ARGV[q], 1, 9) == 'dispatch:' then
          local a = ARGV[q + 1]
          local m = redis.call('HMGET', key, 'sent:' .. a, 'sent:' .. a .. ':hold')
          marks[#marks + 1] = id
          marks[#marks + 1] = m[1]
          marks[#marks + 1] = m[2]
        end
      end
      if ridx > 0 then
        redis.call('SET', KEYS[ridx], rval)
        redis.call('SADD', KEYS[xidx], job)
        if oidx > 0 then redis.call('HSET', KEYS[oidx], job, string.format('%d', clock_us)) end
      end
      versions[#versions + 1] = v
    end
  end
  counts[g] = (#marks - nmarks) / 3
  if delivers and appended > most then most = appended end
end
local delivered = false
-- The count reaches past what was just appended: XREADGROUP hands out the oldest
-- entries first, and under load other writers' entries (an MES burst's starts) stand
-- ahead of these; with the count alone, every call would deliver only older entries
-- and no command would be sent from the decision that made it.
local count = tonumber(ARGV[5]) + most
local function read(keys)
  local args = {'GROUP', ARGV[3], ARGV[4], 'COUNT', count, 'STREAMS'}
  for _, k in ipairs(keys) do args[#args + 1] = k end
  for _ = 1, #keys do args[#args + 1] = '>' end
  -- pcall: a missing group must not turn the writes above into an error reply
  local r = redis.pcall('XREADGROUP', unpack(args))
  if type(r) == 'table' and r['err'] then return nil end
  return r
end
if #streams > 0 then
  if #streams <= 2000 then delivered = read(streams) end
  if delivered == nil or #streams > 2000 then
    -- a stream or group gone (one missing group fails the whole read), or more
    -- streams than one command should take: each stream read alone
    delivered = {}
    for _, k in ipairs(streams) do
      local r = read({k})
      if r then delivered[#delivered + 1] = r[1] end
    end
  end
end
return {versions, marks, counts, delivered}
