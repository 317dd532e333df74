-- Compare-and-set of many jobs of one scope (all keys share the scope's hash tag).
-- KEYS[1] due index (zset), KEYS[2] active set, KEYS[3] work stream,
-- KEYS[4..] the keys records name by index (job hashes, waits indexes, responses, graphs).
-- ARGV[1] = number of records, then each record:
--   job key index, job id, expected version ('0': the job must not exist),
--   state ('' = keep: an index-only record), fingerprint ('' = keep),
--   graph key index (0 = none), graph bytes (stored once, SET NX),
--   reset ('1' = drop every field first: a re-stored job id),
--   due ('' = off the index, else the score), active ('1' add, '0' remove, '' leave),
--   n wait ops, then per op: sign ('+' or '-'), waits key index, score,
--   n entries, then per entry: kind, action, command id,
--   response key index (0 = none), response value.
-- A record whose version does not match writes nothing; the others still apply.
-- Returns one integer per record: the new version, or 0 for a lost race.
local out = {}
local p = 2
local n = tonumber(ARGV[1])
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
  local active = ARGV[p + 9]
  local nw = tonumber(ARGV[p + 10])
  local w = p + 11
  local ne = tonumber(ARGV[w + 3 * nw])
  local e = w + 3 * nw + 1
  local ridx = tonumber(ARGV[e + 3 * ne])
  local rval = ARGV[e + 3 * ne + 1]
  p = e + 3 * ne + 2
  local current = redis.call('HGET', key, 'v') or '0'
  if current ~= expected then
    out[r] = 0
  else
    local v = tonumber(current) + 1
    if state ~= '' then
      if reset == '1' then redis.call('DEL', key) end
      if fp ~= '' then
        redis.call('HSET', key, 's', state, 'v', v, 'g', fp)
      else
        redis.call('HSET', key, 's', state, 'v', v)
      end
      if gidx > 0 then redis.call('SET', KEYS[gidx], gbytes, 'NX') end
    else
      v = tonumber(current)
    end
    if due == '' then
      redis.call('ZREM', KEYS[1], job)
    else
      redis.call('ZADD', KEYS[1], due, job)
    end
    if active == '1' then
      redis.call('SADD', KEYS[2], job)
    elseif active == '0' then
      redis.call('SREM', KEYS[2], job)
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
      redis.call('XADD', KEYS[3], '*', 'k', ARGV[q], 'j', job, 'a', ARGV[q + 1],
                 'c', ARGV[q + 2])
    end
    if ridx > 0 then redis.call('SET', KEYS[ridx], rval) end
    out[r] = v
  end
end
return out
