-- Compare-and-set of a job order, and the work entries it implies, in one step.
-- KEYS[1] order hash, KEYS[2] work stream, KEYS[3] state index (job -> state),
-- KEYS[4] index seq, KEYS[5] live set (orders not ended); then for EndState
-- KEYS[6] job hash, KEYS[7] job response; else KEYS[6] (optional) a key that must
-- exist: the Work Master a Store names
-- ARGV[1] expected version ('0': the order must not exist), ARGV[2] new order state,
-- ARGV[3] order JSON ('' = keep), ARGV[4] reason ('' = keep), ARGV[5] job id,
-- ARGV[6] n entries, then per entry: kind; for EndState then the retention in seconds
-- (the order, job hash and response expire together; 0 = kept). A Store (the only
-- write with the Work Master key) takes the order off that timer: an id stored again
-- within the retention.
-- Extra fields after these: pairs of (field, value) stored on the order too.
-- The index, its seq and the live set change in the same step, whoever writes the
-- order (the MES side or a recipe's Run/Complete/Abort), so the live count that
-- limits Store is exact.
-- Returns the new version, 0 when the expected version did not match, -1 when
-- KEYS[6] does not exist.
local ending = ARGV[2] == 'EndState'
local storing = not ending and KEYS[6] ~= nil
if storing and redis.call('EXISTS', KEYS[6]) == 0 then return -1 end
local current = redis.call('HGET', KEYS[1], 'v') or '0'
if current ~= ARGV[1] then return 0 end
local v = tonumber(current) + 1
redis.call('HSET', KEYS[1], 'v', v, 'state', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'order', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'reason', ARGV[4]) end
local ne = tonumber(ARGV[6])
for i = 1, ne do
  redis.call('XADD', KEYS[2], '*', 'k', ARGV[6 + i], 'j', ARGV[5])
end
local q = 7 + ne
if ending then
  local ttl = tonumber(ARGV[q])
  q = q + 1
  if ttl > 0 then
    for _, key in ipairs({KEYS[1], KEYS[6], KEYS[7]}) do redis.call('EXPIRE', key, ttl) end
  end
elseif storing then
  redis.call('PERSIST', KEYS[1])
end
while q < #ARGV do
  redis.call('HSET', KEYS[1], ARGV[q], ARGV[q + 1])
  q = q + 2
end
local state = ARGV[2]
if state == 'EndState' then
  redis.call('HDEL', KEYS[3], ARGV[5])
else
  redis.call('HSET', KEYS[3], ARGV[5], state)
end
local top = string.match(state, '^[^_]+')
if top == 'Ended' or top == 'Aborted' or top == 'EndState' then
  redis.call('SREM', KEYS[5], ARGV[5])
else
  redis.call('SADD', KEYS[5], ARGV[5])
end
redis.call('INCR', KEYS[4])
return v
