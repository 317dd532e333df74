-- One sweep of a scope: pop the due jobs, queue a tick entry for each, write the
-- scope's heartbeat. If the heartbeat is older than the outage threshold, every job
-- of the index must see the gap, so all open deadlines move: the index is set aside
-- whole (RENAME, O(1)) as the scope's shifting set with the gap, and each sweep takes
-- at most `limit` jobs of it and ticks them with the gap, so an outage over a million
-- jobs never blocks Redis in one script. Deadlines written meanwhile go to a fresh
-- index. An outage while a shift is still under way adds its gap to the jobs still
-- waiting and ticks the fresh index's jobs with the new gap at once (rare: unbounded).
-- KEYS[1] due index, KEYS[2] heartbeat, KEYS[3] work stream, KEYS[4] shifting set,
-- KEYS[5] the shifting set's gap
-- ARGV[1] limit, ARGV[2] outage threshold (ms), ARGV[3] '1': trim the stream of
-- entries every group has acked (older than each group's oldest pending entry and
-- not newer than what it was delivered last).
-- Returns {now_ms, gap_ms (0 = no outage), jobs queued, jobs still to shift}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = tonumber(redis.call('GET', KEYS[2]) or '')
local gap = 0
if last ~= nil and now - last > tonumber(ARGV[2]) then gap = now - last end
redis.call('SET', KEYS[2], now)
local limit = tonumber(ARGV[1])
local queued = 0
local function tick(job, g)
  if g > 0 then
    redis.call('XADD', KEYS[3], '*', 'k', 'tick', 'j', job, 'g', g)
  else
    redis.call('XADD', KEYS[3], '*', 'k', 'tick', 'j', job)
  end
  queued = queued + 1
end
if gap > 0 then
  if redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('INCRBY', KEYS[5], gap)
    for _, job in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
      redis.call('ZREM', KEYS[1], job)
      tick(job, gap)
    end
  elseif redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('RENAME', KEYS[1], KEYS[4])
    redis.call('SET', KEYS[5], gap)
  end
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  local g = tonumber(redis.call('GET', KEYS[5]) or '0')
  local popped = redis.call('ZPOPMIN', KEYS[4], limit)
  for i = 1, #popped, 2 do tick(popped[i], g) end
  if redis.call('EXISTS', KEYS[4]) == 0 then redis.call('DEL', KEYS[5]) end
end
for _, job in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', KEYS[1], job)
  tick(job, 0)
end
if ARGV[3] == '1' then
  local groups = redis.call('XINFO', 'GROUPS', KEYS[3])
  local keep = nil
  for _, g in ipairs(groups) do
    local info = {}
    for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
    local cand
    if tonumber(info['pending']) > 0 then
      cand = redis.call('XPENDING', KEYS[3], info['name'])[2]
    else
      local ms, seq = string.match(info['last-delivered-id'], '^(%d+)-(%d+)$')
      cand = ms .. '-' .. (tonumber(seq) + 1)
    end
    local cms, cseq = string.match(cand, '^(%d+)-(%d+)$')
    cms, cseq = tonumber(cms), tonumber(cseq)
    if keep == nil or cms < keep[1] or (cms == keep[1] and cseq < keep[2]) then
      keep = {cms, cseq}
    end
  end
  if keep ~= nil then
    redis.call('XTRIM', KEYS[3], 'MINID', string.format('%d-%d', keep[1], keep[2]))
  end
end
return {now, gap, queued, redis.call('ZCARD', KEYS[4])}
