-- Compare-and-set of many jobs, grouped by scope. On Redis Cluster the host sends one
-- group per call (every key of a scope shares its hash tag, so a call touches one
-- slot); on a single Redis one call may carry the groups of many scopes.
-- KEYS: every key the groups name, by index.
-- ARGV[1] = number of groups; ARGV[2] = the latest server time (ms) at which these
-- decisions may still be written ('0': any time): a host frozen between reading a job
-- and this call decided on a clock from before a possible outage, so nothing is
-- written (every record loses, and the host reads the jobs again); then per group:
--   due index key index, active set key index, work stream key index, offset key index,
--   deliver ('1': then group, consumer, count follow; '0': nothing follows),
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
--     index (the job joins it with its response: the state index's has_result),
--     archive records to append ('' = none; written with a state, appended to the
--     job's archive chunks h:1, h:2, ... (hn: the last one's number)).
-- A record whose version does not match writes nothing; the others still apply.
-- With deliver, after its records the group's new entries (those just appended among
-- them) are delivered to that consumer with XREADGROUP: the host that made a command
-- sends it without reading the stream or the job again, and every entry still has
-- exactly one owner.
-- Returns per group {versions, markers, delivered}: per record the new version (0: lost
-- race); per dispatch entry written, in order, the entry id and the current values of
-- the action's markers sent:{action} and sent:{action}:hold (false when unset); the
-- XREADGROUP reply (or false).
local result = {}
local p = 3
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
for g = 1, tonumber(ARGV[1]) do
  local due_key = KEYS[tonumber(ARGV[p])]
  local active_key = KEYS[tonumber(ARGV[p + 1])]
  local work_key = KEYS[tonumber(ARGV[p + 2])]
  local offset = redis.call('GET', KEYS[tonumber(ARGV[p + 3])]) or '0'
  local dgroup, dconsumer, dcount = nil, nil, nil
  if ARGV[p + 4] == '1' then
    dgroup, dconsumer, dcount = ARGV[p + 5], ARGV[p + 6], tonumber(ARGV[p + 7])
    p = p + 8
  else
    p = p + 5
  end
  local n = tonumber(ARGV[p])
  p = p + 1
  local out = {}
  local marks = {}
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
    local archive = ARGV[e + 3 * ne + 3]
    p = e + 3 * ne + 4
    local current = redis.call('HGET', key, 'v') or '0'
    if too_late or current ~= expected or (state ~= '' and roffset ~= offset) then
      out[r] = 0
    else
      local v = math.max(tonumber(current) + 1, clock_us)
      if state ~= '' then
        if reset == '1' then redis.call('DEL', key) end
        local vs = string.format('%d', v)
        if fp ~= '' then
          redis.call('HSET', key, 's', state, 'v', vs, 'g', fp)
        else
          redis.call('HSET', key, 's', state, 'v', vs)
        end
        if offset ~= '0' then redis.call('HSET', key, 'o', offset) end
        -- settled records of the state, appended (no event reads or rewrites them again)
        -- to the last chunk h:{hn} while it stays under 4 KB: few fields, bounded work
        if archive ~= '' then
          local hn = tonumber(redis.call('HGET', key, 'hn') or '0')
          local last = hn > 0 and redis.call('HGET', key, 'h:' .. hn)
          if last and #last + #archive <= 4096 then
            redis.call('HSET', key, 'h:' .. hn, last .. archive)
          else
            redis.call('HSET', key, 'h:' .. (hn + 1), archive, 'hn', hn + 1)
          end
        end
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
      for i = 0, ne - 1 do
        local q = e + 3 * i
        local id = redis.call('XADD', work_key, '*', 'k', ARGV[q], 'j', job, 'a', ARGV[q + 1],
                              'c', ARGV[q + 2])
        if string.sub(ARGV[q], 1, 9) == 'dispatch:' then
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
      end
      out[r] = v
    end
  end
  local delivered = false
  if dgroup ~= nil then
    -- pcall: a missing group must not turn the writes above into an error reply
    delivered = redis.pcall('XREADGROUP', 'GROUP', dgroup, dconsumer, 'COUNT', dcount,
                            'STREAMS', work_key, '>')
    if type(delivered) == 'table' and delivered['err'] then delivered = false end
  end
  result[g] = {out, marks, delivered}
end
return result
