// kafkajs against a Kafkaesque cluster: `node matrix.js <bootstrap> <prefix>` runs the client
// matrix of issue 33 and prints one JSON object of what it saw (tests/broker/test_kafka_kafkajs.py
// judges it). Every wait is bounded; any error prints {"error": ...} and exits 1.
'use strict'
const { Kafka, logLevel, CompressionTypes } = require('kafkajs')

const [bootstrap, prefix] = process.argv.slice(2)
const kafka = new Kafka({
  clientId: 'kafkaesque-matrix',
  brokers: bootstrap.split(','),
  logLevel: logLevel.NOTHING,
  retry: { retries: 8, initialRetryTime: 100 },
})
const PARTITIONS = 4
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function until(condition, what, ms = 30000) {
  const deadline = Date.now() + ms
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(50)
  }
}

const show = (m) => ({
  key: m.key === null ? null : m.key.toString(),
  value: m.value === null ? null : m.value.toString(),
  headers: Object.fromEntries(Object.entries(m.headers || {}).map(([k, v]) => [k, v.toString()])),
  offset: Number(m.offset),
  timestamp: Number(m.timestamp),
})

function member(groupId, got, assignments, name) {
  const consumer = kafka.consumer({
    groupId,
    sessionTimeout: 6000,
    heartbeatInterval: 300,
    rebalanceTimeout: 10000,
    maxWaitTimeInMs: 300, // a leaving member waits out its fetch's long poll (5 s by default)
    retry: { retries: 8, initialRetryTime: 100 },
  })
  consumer.on(consumer.events.GROUP_JOIN, (e) => {
    assignments.push({ name, partitions: (e.payload.memberAssignment[topicOf(groupId)] || []).slice().sort() })
  })
  return {
    consumer,
    async start(topic, fromBeginning = true) {
      await consumer.connect()
      await consumer.subscribe({ topic, fromBeginning })
      await consumer.run({
        eachMessage: async ({ partition, message }) => {
          got.push({ member: name, partition, ...show(message) })
        },
      })
    },
  }
}
const groupTopics = {}
const topicOf = (groupId) => groupTopics[groupId]

async function main() {
  const out = { ms: {} }
  const started = Date.now()
  const lap = (what) => { out.ms[what] = Date.now() - started }
  const admin = kafka.admin()
  await admin.connect()
  const records = `${prefix}-records`
  const group = `${prefix}-group`
  const times = `${prefix}-times`
  const doomed = `${prefix}-doomed`
  out.created = await admin.createTopics({
    topics: [
      { topic: records, numPartitions: 1, replicationFactor: 3 },
      { topic: group, numPartitions: PARTITIONS, replicationFactor: 3 },
      { topic: times, numPartitions: 1, replicationFactor: 3 },
      { topic: doomed, numPartitions: 2, replicationFactor: 3 },
    ],
    waitForLeaders: true,
  })
  out.listed = (await admin.listTopics()).filter((t) => t.startsWith(prefix)).sort()

  // An idempotent producer, acks=all: headers, null keys and values, with each built-in codec.
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 })
  await producer.connect()
  const sent = []
  for (const [codec, compression] of [['none', CompressionTypes.None], ['gzip', CompressionTypes.GZIP]]) {
    const messages = [
      { key: `${codec}-k0`, value: `${codec}-v0`, headers: { h: '1', empty: '' } },
      { key: null, value: `${codec}-no key` },
      { key: `${codec}-tombstone`, value: null, headers: { why: 'deleted' } },
      { key: null, value: null },
      { key: `${codec}-big`, value: 'x'.repeat(10000) },
    ]
    const acks = await producer.send({ topic: records, acks: -1, compression, messages })
    sent.push({ codec, acks: acks.map((a) => ({ errorCode: a.errorCode, baseOffset: Number(a.baseOffset) })) })
    for (const m of messages) {
      out.expected = out.expected || []
      out.expected.push({ key: m.key, value: m.value, headers: m.headers || {} })
    }
  }
  out.sent = sent
  const reader = kafka.consumer({ groupId: `${prefix}-reader`, maxWaitTimeInMs: 300 })
  const read = []
  await reader.connect()
  await reader.subscribe({ topic: records, fromBeginning: true })
  await reader.run({ eachMessage: async ({ message }) => { read.push(show(message)) } })
  await until(() => read.length >= out.expected.length, 'the records read back')
  await reader.disconnect()
  lap('read')
  out.read = read.map(({ key, value, headers }) => ({ key, value, headers }))

  // A group of two: the second member's join rebalances it; both commit; a third resumes.
  for (let i = 0; i < 100; i++) {
    await producer.send({ topic: group, acks: -1, messages: [{ key: `k${i}`, value: `v${i}` }] })
  }
  groupTopics[`${prefix}-g`] = group
  const got = []
  const assignments = []
  const first = member(`${prefix}-g`, got, assignments, 'first')
  await first.start(group)
  await until(() => got.length >= 1, 'the first member reading')
  const second = member(`${prefix}-g`, got, assignments, 'second')
  await second.start(group)
  await until(() => assignments.some((a) => a.name === 'second') &&
    new Set(got.map((g) => g.value)).size >= 100, 'the rebalance and all 100 records')
  lap('group')
  out.described = (await admin.describeGroups([`${prefix}-g`])).groups.map((g) => ({
    groupId: g.groupId, state: g.state, protocolType: g.protocolType,
    members: g.members.map((m) => m.clientId).sort(),
  }))
  out.assignments = assignments.slice()
  await first.consumer.disconnect() // each commits what it has read as it leaves
  lap('first left')
  await second.consumer.disconnect()
  lap('second left')
  out.groupValues = got.map((g) => g.value)
  for (let i = 100; i < 120; i++) {
    await producer.send({ topic: group, acks: -1, messages: [{ key: `k${i}`, value: `v${i}` }] })
  }
  const resumed = []
  const third = member(`${prefix}-g`, resumed, [], 'third')
  lap('produced 20')
  await third.start(group)
  lap('third started')
  await until(() => resumed.length >= 20, 'the third member resuming')
  await sleep(500) // anything from before the commits would come with them
  await third.consumer.disconnect()
  lap('resumed')
  out.resumed = resumed.map((g) => g.value)

  // Seek by timestamp: the admin finds the offset for a time, a consumer seeks there.
  const base = Date.now() - 60000
  for (let i = 0; i < 10; i++) {
    await producer.send({ topic: times, acks: -1, messages: [{ value: `t${i}`, timestamp: String(base + 1000 * i) }] })
  }
  const [found] = await admin.fetchTopicOffsetsByTimestamp(times, base + 3500)
  out.foundOffset = Number(found.offset)
  const sought = []
  const seeker = kafka.consumer({ groupId: `${prefix}-seeker`, maxWaitTimeInMs: 300 })
  await seeker.connect()
  // From the end (nothing to read before the seek), then back to the offset found.
  await seeker.subscribe({ topic: times, fromBeginning: false })
  await seeker.run({ eachMessage: async ({ message }) => { sought.push(show(message)) } })
  seeker.seek({ topic: times, partition: 0, offset: String(found.offset) })
  await until(() => sought.length >= 6, 'the records after the seek')
  await seeker.disconnect()
  lap('sought')
  out.sought = sought.map((m) => m.value)
  out.firstSoughtTimestamp = sought[0].timestamp - base

  await admin.deleteTopics({ topics: [doomed] })
  let after = []
  for (let i = 0; i < 50; i++) {
    after = await admin.listTopics()
    if (!after.includes(doomed)) break
    await sleep(100)
  }
  lap('deleted')
  out.afterDelete = after.filter((t) => t.startsWith(prefix)).sort()
  await producer.disconnect()
  await admin.disconnect()
  return out
}

const timer = setTimeout(() => {
  console.log(JSON.stringify({ error: 'the whole run timed out' }))
  process.exit(1)
}, 120000)
main().then(
  (out) => { clearTimeout(timer); console.log(JSON.stringify(out)); process.exit(0) },
  (err) => { clearTimeout(timer); console.log(JSON.stringify({ error: String(err && err.stack || err) })); process.exit(1) },
)
