-- One sweep of one or more scopes (several only where their keys share a node: on a
-- single Redis; one per call on a cluster). Per scope: pop the due jobs, queue tick
-- entries for them (up to ARGV[4] jobs an entry, one per line of field j), write the
-- scope's heartbeat.
-- If the heartbeat is older than the outage threshold, no host swept the scope for that
-- long, and every open deadline must move by the gap instead of expiring: the gap is
-- added to the scope's offset, in O(1) for any number of jobs. Due scores are deadlines
-- minus the offset a job's state has seen, so the index moves with the offset, and each
-- state catches up when it is next read (Store.load, the core's Shift).
-- KEYS, four per scope: due index, heartbeat, work stream, offset
-- ARGV[1] limit (per scope), ARGV[2] outage threshold (ms), ARGV[3] '1': trim the
-- stream of entries every group has acked (older than each group's oldest pending entry
-- and not newer than what it was delivered last), ARGV[4] jobs per tick entry, ARGV[5]
-- the hosts' consumer group, ARGV[6] the claim threshold (ms), ARGV[7] one character
-- per scope: '0' no look at the stream (nothing happened there that this host knows
-- of), '1' trim it, '2' trim it and look for entries pending on the group longer than
-- the threshold.
-- Returns {now_ms, then per scope gap_ms (0 = no outage), jobs queued, offset, the
-- lowest score left on the due index ('' when none), 1 when there are entries to
-- claim (else 0), 1 when a group still has entries pending (else 0)}: with the score
-- the host sweeps the scope again when its next deadline comes, not on every pass;
-- with the last two it claims only where it must and trims again only while entries
-- are in flight.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, threshold, per = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
local group, min_idle, flags = ARGV[5], ARGV[6], ARGV[7]

-- the oldest entry some group still needs: each group's oldest pending entry, or the
-- one after what it was delivered last
local function keep_from(work, groups)
  local keep = nil
  for _, info in ipairs(groups) do
    local cand
    if tonumber(info['pending']) > 0 then
      cand = redis.call('XPENDING', work, info['name'])[2]
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
  return keep
end

local out = {now}
for s = 1, #KEYS, 4 do
  local due_key, hb_key, work, offset_key = KEYS[s], KEYS[s + 1], KEYS[s + 2], KEYS[s + 3]
  -- the heartbeat written and the previous one read in one command (SET … GET: 6.2)
  local last = tonumber(redis.call('SET', hb_key, now, 'GET') or '')
  local gap = 0
  if last ~= nil and now - last > threshold then gap = now - last end
  local offset = tonumber(redis.call('GET', offset_key) or '0')
  if gap > 0 then offset = redis.call('INCRBY', offset_key, gap) end
  -- the lowest score first: an idle scope (nothing due) costs this one read
  local lowest = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')[2]
  local n = 0
  if lowest ~= nil and tonumber(lowest) <= now - offset then
    -- the lowest scores first: exactly ranks 0 .. #due - 1, removed in one call
    local due = redis.call('ZRANGEBYSCORE', due_key, '-inf', now - offset, 'LIMIT', 0, limit)
    n = #due
    redis.call('ZREMRANGEBYRANK', due_key, 0, n - 1)
    for i = 1, n, per do
      redis.call('XADD', work, '*', 'k', 'tick', 'j',
                 table.concat(due, '\n', i, math.min(i + per - 1, n)))
    end
    lowest = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')[2]
  end
  local look = string.sub(flags, (s + 3) / 4, (s + 3) / 4)
  -- pcall: a stream deleted under the hosts is made again by the reader, not a failed
  -- sweep
  local raw = look ~= '0' and redis.pcall('XINFO', 'GROUPS', work)
  local groups = {}
  if type(raw) == 'table' and not raw['err'] then
    for _, g in ipairs(raw) do
      local info = {}
      for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
      groups[#groups + 1] = info
    end
  end
  local in_flight = 0
  for _, info in ipairs(groups) do
    if tonumber(info['pending']) > 0 then in_flight = 1 end
  end
  if ARGV[3] == '1' then
    local keep = keep_from(work, groups)
    if keep ~= nil then
      redis.call('XTRIM', work, 'MINID', string.format('%d-%d', keep[1], keep[2]))
    end
  end
  local orphans = 0
  if look == '2' then
    for _, info in ipairs(groups) do
      if info['name'] == group and tonumber(info['pending']) > 0 and
          #redis.call('XPENDING', work, group, 'IDLE', min_idle, '-', '+', 1) > 0 then
        orphans = 1
      end
    end
  end
  out[#out + 1] = gap
  out[#out + 1] = n
  out[#out + 1] = offset
  out[#out + 1] = lowest or ''
  out[#out + 1] = orphans
  out[#out + 1] = in_flight
end
return out
