-- One sweep of a scope: pop the due jobs, queue a tick entry for each, write the
-- scope's heartbeat. If the heartbeat is older than the outage threshold, every job
-- of the index is taken and its tick carries the gap, so all open deadlines move.
-- KEYS[1] due index, KEYS[2] heartbeat, KEYS[3] work stream
-- ARGV[1] limit, ARGV[2] outage threshold (ms)
-- Returns {now_ms, gap_ms (0 = no outage), jobs queued}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = tonumber(redis.call('GET', KEYS[2]) or '')
local gap = 0
if last ~= nil and now - last > tonumber(ARGV[2]) then gap = now - last end
redis.call('SET', KEYS[2], now)
local jobs
if gap > 0 then
  jobs = redis.call('ZRANGE', KEYS[1], 0, -1)
else
  jobs = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
end
for _, job in ipairs(jobs) do
  redis.call('ZREM', KEYS[1], job)
  if gap > 0 then
    redis.call('XADD', KEYS[3], '*', 'k', 'tick', 'j', job, 'g', gap)
  else
    redis.call('XADD', KEYS[3], '*', 'k', 'tick', 'j', job)
  end
end
return {now, gap, #jobs}
