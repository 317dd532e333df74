-- Compare-and-set of a job order, and the work entries it implies, in one step.
-- KEYS[1] order hash, KEYS[2] work stream, KEYS[3] state index (job -> state),
-- KEYS[4] index seq, KEYS[5] live set (orders not ended), KEYS[6] index order (sorted
-- set job -> the order's Priority), KEYS[7] results set (jobs with a job response),
-- KEYS[8] index entries (hash job -> its entry of the published index, up to its
-- has_result value), KEYS[9] the MES outbox (hash job -> stamp); then for EndState
-- KEYS[10] job hash, KEYS[11] job response; else KEYS[10] (optional, a Store) a key
-- that must exist: the Work Master it names, or the order hash itself for a Store that
-- names none
-- ARGV[1] expected version ('0': the order must not exist), ARGV[2] new order state,
-- ARGV[3] order JSON ('' = keep), ARGV[4] reason ('' = keep), ARGV[5] job id,
-- ARGV[6] the job's index entry for the new state (KEYS[8]; '' for EndState), ARGV[7]
-- the order's Priority ('' = keep its place in the index order), ARGV[8] '1': stamp
-- the order in the outbox (a host that publishes to an MES; '' none does),
-- ARGV[9] n entries, then per entry: kind; for EndState then the retention in seconds
-- (the order, job hash and response expire together; 0 = kept). A Store (the only
-- write with the Work Master key) takes the order off that timer: an id stored again
-- within the retention.
-- Extra fields after these: pairs of (field, value) stored on the order too.
-- The index, its seq and the live set change in the same step, whoever writes the
-- order (the MES side or a recipe's Run/Complete/Abort), so the live count that
-- limits Store is exact.
-- The outbox stamp (server time in µs) is written in the same step as the change, so
-- the MES is sent the change even when the host that made it dies before publishing it
-- (sfc_host/store/outbox.py).
-- Returns the new version, 0 when the expected version did not match, -1 when
-- KEYS[10] does not exist.
local ending = ARGV[2] == 'EndState'
local storing = not ending and KEYS[10] ~= nil
if storing and KEYS[10] ~= KEYS[1] and redis.call('EXISTS', KEYS[10]) == 0 then return -1 end
local current = redis.call('HGET', KEYS[1], 'v') or '0'
if current ~= ARGV[1] then return 0 end
local v = tonumber(current) + 1
redis.call('HSET', KEYS[1], 'v', v, 'state', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'order', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'reason', ARGV[4]) end
local ne = tonumber(ARGV[9])
for i = 1, ne do
  redis.call('XADD', KEYS[2], '*', 'k', ARGV[9 + i], 'j', ARGV[5])
end
local q = 10 + ne
if ending then
  local ttl = tonumber(ARGV[q])
  q = q + 1
  if ttl > 0 then
    for _, key in ipairs({KEYS[1], KEYS[10], KEYS[11]}) do redis.call('EXPIRE', key, ttl) end
  end
elseif storing then
  redis.call('PERSIST', KEYS[1])
end
while q < #ARGV do
  redis.call('HSET', KEYS[1], ARGV[q], ARGV[q + 1])
  q = q + 2
end
local state = ARGV[2]
if ending then
  redis.call('HDEL', KEYS[3], ARGV[5])
  redis.call('ZREM', KEYS[6], ARGV[5])
  redis.call('HDEL', KEYS[8], ARGV[5])
  redis.call('SREM', KEYS[7], ARGV[5])
else
  redis.call('HSET', KEYS[3], ARGV[5], state)
  redis.call('HSET', KEYS[8], ARGV[5], ARGV[6])
  if ARGV[7] ~= '' then
    redis.call('ZADD', KEYS[6], tonumber(ARGV[7]) or 0, ARGV[5])
  end
end
local top = string.match(state, '^[^_]+')
if top == 'Ended' or top == 'Aborted' or top == 'EndState' then
  redis.call('SREM', KEYS[5], ARGV[5])
else
  redis.call('SADD', KEYS[5], ARGV[5])
end
redis.call('INCR', KEYS[4])
if ARGV[8] == '1' then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[9], ARGV[5], t[1] .. string.format('%06d', tonumber(t[2])))
end
return v
