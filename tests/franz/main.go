// Command franz runs franz-go (a strict, modern Go Kafka client) and its admin package kadm
// against a Kafka cluster: it creates, lists and describes topics, produces idempotently with
// acks=all (keys, headers) and reads the records back, runs a consumer group of two clients
// through a rebalance with commits, describes the group and its lag, and deletes a topic.
//
//	franz BOOTSTRAP PREFIX
//
// It prints one JSON object on its last line (with "error" if a step failed) for
// tests/peers/test_franz_go.py to judge; the program itself judges nothing.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Record is one record as produced or read: enough to compare the two exactly.
type Record struct {
	Partition int32             `json:"partition"`
	Offset    int64             `json:"offset"`
	Key       string            `json:"key"`
	Value     string            `json:"value"`
	Headers   map[string]string `json:"headers"`
}

// Assignment is one partitions-assigned callback of a group member.
type Assignment struct {
	Name       string  `json:"name"`
	Partitions []int32 `json:"partitions"`
}

type output map[string]any

var out = output{}

func fail(step string, err error) {
	out["error"] = fmt.Sprintf("%s: %v", step, err)
	emit()
	os.Exit(1)
}

func emit() {
	line, err := json.Marshal(out)
	if err != nil {
		fmt.Printf("{\"error\": %q}\n", err.Error())
		return
	}
	fmt.Println(string(line))
}

func toRecord(r *kgo.Record) Record {
	headers := map[string]string{}
	for _, h := range r.Headers {
		headers[h.Key] = string(h.Value)
	}
	return Record{r.Partition, r.Offset, string(r.Key), string(r.Value), headers}
}

func sortRecords(rs []Record) {
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].Partition != rs[j].Partition {
			return rs[i].Partition < rs[j].Partition
		}
		return rs[i].Offset < rs[j].Offset
	})
}

func listed(ctx context.Context, adm *kadm.Client, prefix string) []string {
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		fail("list topics", err)
	}
	names := []string{}
	for _, name := range topics.Names() {
		if strings.HasPrefix(name, prefix+"-") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

func contains(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

func produce(ctx context.Context, cl *kgo.Client, records []*kgo.Record) []Record {
	results := cl.ProduceSync(ctx, records...)
	if err := results.FirstErr(); err != nil {
		fail("produce", err)
	}
	produced := []Record{}
	for _, r := range results {
		produced = append(produced, toRecord(r.Record))
	}
	return produced
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: franz BOOTSTRAP PREFIX")
		os.Exit(2)
	}
	seeds := strings.Split(os.Args[1], ",")
	prefix := os.Args[2]
	recordsTopic, groupTopic, doomed := prefix+"-records", prefix+"-group", prefix+"-doomed"
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	admin, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		fail("admin client", err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)

	// Admin: create, list, describe.
	for _, spec := range []struct {
		name       string
		partitions int32
	}{{recordsTopic, 3}, {groupTopic, 4}, {doomed, 1}} {
		created, err := adm.CreateTopic(ctx, spec.partitions, 3, nil, spec.name)
		if err == nil {
			err = created.Err
		}
		if err != nil {
			fail("create topic "+spec.name, err)
		}
	}
	out["listed"] = listed(ctx, adm, prefix)
	described, err := adm.ListTopics(ctx, recordsTopic, groupTopic)
	if err != nil {
		fail("describe topics", err)
	}
	shapes := map[string]map[string]int{}
	for _, detail := range described.Sorted() {
		if detail.Err != nil {
			fail("describe "+detail.Topic, detail.Err)
		}
		leaders := map[int32]bool{}
		replicas, isr := 0, 0
		for _, p := range detail.Partitions.Sorted() {
			leaders[p.Leader] = true
			replicas += len(p.Replicas)
			isr += len(p.ISR)
		}
		shapes[detail.Topic] = map[string]int{
			"partitions": len(detail.Partitions),
			"replicas":   replicas,
			"isr":        isr,
			"leaders":    len(leaders),
		}
	}
	out["described"] = shapes

	// Produce idempotently (franz-go's default) with acks=all, keys and headers; read back.
	producer, err := kgo.NewClient(
		kgo.SeedBrokers(seeds...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(5*time.Millisecond),
	)
	if err != nil {
		fail("producer client", err)
	}
	defer producer.Close()
	batch := []*kgo.Record{}
	for i := 0; i < 60; i++ {
		batch = append(batch, &kgo.Record{
			Topic: recordsTopic,
			Key:   []byte(fmt.Sprintf("k%d", i%7)),
			Value: []byte(fmt.Sprintf("v%d", i)),
			Headers: []kgo.RecordHeader{
				{Key: "seq", Value: []byte(fmt.Sprint(i))},
				{Key: "origin", Value: []byte("franz-go")},
			},
		})
	}
	expected := produce(ctx, producer, batch)
	sortRecords(expected)
	out["expected"] = expected

	reader, err := kgo.NewClient(
		kgo.SeedBrokers(seeds...),
		kgo.ConsumeTopics(recordsTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		fail("reader client", err)
	}
	read := []Record{}
	for len(read) < len(expected) && ctx.Err() == nil {
		pollCtx, pollCancel := context.WithTimeout(ctx, time.Second)
		fetches := reader.PollFetches(pollCtx)
		pollCancel()
		fetches.EachError(func(t string, p int32, err error) {
			if err != context.DeadlineExceeded {
				fail(fmt.Sprintf("fetch %s/%d", t, p), err)
			}
		})
		fetches.EachRecord(func(r *kgo.Record) { read = append(read, toRecord(r)) })
	}
	reader.Close()
	sortRecords(read)
	out["read"] = read

	// A consumer group of two members: the first alone, then a rebalance (franz-go's default
	// balancer is cooperative-sticky: two rounds), reads by both, commits, the group's lag.
	group := prefix + "-g"
	keyed := func(from, to int) []*kgo.Record {
		rs := []*kgo.Record{}
		for i := from; i < to; i++ {
			v := []byte(fmt.Sprintf("v%d", i))
			rs = append(rs, &kgo.Record{Topic: groupTopic, Key: v, Value: v})
		}
		return rs
	}
	produce(ctx, producer, keyed(0, 50))

	var mu sync.Mutex
	assignments := []Assignment{}
	owned := map[string]map[int32]bool{"first": {}, "second": {}}
	member := func(name string) *kgo.Client {
		change := func(a map[string][]int32, add bool) {
			mu.Lock()
			defer mu.Unlock()
			for _, p := range a[groupTopic] {
				if add {
					owned[name][p] = true
				} else {
					delete(owned[name], p)
				}
			}
			if add {
				parts := append([]int32{}, a[groupTopic]...)
				sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
				assignments = append(assignments, Assignment{name, parts})
			}
		}
		cl, err := kgo.NewClient(
			kgo.SeedBrokers(seeds...),
			kgo.ConsumerGroup(group),
			kgo.ConsumeTopics(groupTopic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.DisableAutoCommit(),
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
				change(a, true)
			}),
			kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
				change(a, false)
			}),
			kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
				change(a, false)
			}),
		)
		if err != nil {
			fail("group member "+name, err)
		}
		return cl
	}
	ownedBy := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(owned[name])
	}
	seen := map[string]bool{}
	readBy := map[string]int{}
	poll := func(cl *kgo.Client, name string) {
		pollCtx, pollCancel := context.WithTimeout(ctx, 200*time.Millisecond)
		fetches := cl.PollRecords(pollCtx, 10)
		pollCancel()
		fetches.EachError(func(t string, p int32, err error) {
			if err != context.DeadlineExceeded && err != context.Canceled {
				fail(fmt.Sprintf("%s fetch %s/%d", name, t, p), err)
			}
		})
		n := 0
		fetches.EachRecord(func(r *kgo.Record) { seen[string(r.Value)] = true; n++ })
		readBy[name] += n
		if n > 0 {
			if err := cl.CommitUncommittedOffsets(ctx); err != nil {
				fail(name+" commit", err)
			}
		}
	}
	first := member("first")
	defer first.Close()
	for readBy["first"] == 0 && ctx.Err() == nil {
		poll(first, "first")
	}
	second := member("second")
	defer second.Close()
	// Until the rebalance has given each member a share (the first keeps reading meanwhile).
	for (ownedBy("first") == 0 || ownedBy("second") == 0 || ownedBy("first")+ownedBy("second") < 4) && ctx.Err() == nil {
		poll(first, "first")
		poll(second, "second")
	}
	produce(ctx, producer, keyed(50, 100))
	for len(seen) < 100 && ctx.Err() == nil {
		poll(first, "first")
		poll(second, "second")
	}
	groupValues := []string{}
	for v := range seen {
		groupValues = append(groupValues, v)
	}
	sort.Strings(groupValues)
	out["groupValues"] = groupValues
	out["readBy"] = readBy
	mu.Lock()
	out["assignments"] = assignments
	mu.Unlock()

	// Twenty more, unread: the lag kadm computes from the commits and the end offsets.
	more := []*kgo.Record{}
	for i := 100; i < 120; i++ {
		more = append(more, &kgo.Record{Topic: groupTopic, Value: []byte(fmt.Sprintf("v%d", i))})
	}
	produce(ctx, producer, more)
	groups, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		fail("describe group", err)
	}
	g := groups[group]
	if g.Err != nil {
		fail("describe group", g.Err)
	}
	members := []map[string]any{}
	for _, m := range g.Members {
		assigned, _ := m.Assigned.AsConsumer()
		parts := []int32{}
		if assigned != nil {
			for _, t := range assigned.Topics {
				parts = append(parts, t.Partitions...)
			}
		}
		sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
		members = append(members, map[string]any{"clientID": m.ClientID, "partitions": parts})
	}
	out["group"] = map[string]any{
		"state":        g.State,
		"protocolType": g.ProtocolType,
		"protocol":     g.Protocol,
		"members":      members,
	}
	lags, err := adm.Lag(ctx, group)
	if err != nil {
		fail("lag", err)
	}
	lag := lags[group]
	if err := lag.Error(); err != nil {
		fail("lag", err)
	}
	perPartition := map[string]int64{}
	for _, l := range lag.Lag.Sorted() {
		if l.Err != nil {
			fail("lag partition", l.Err)
		}
		perPartition[fmt.Sprint(l.Partition)] = l.Lag
	}
	out["lag"] = map[string]any{"total": lag.Lag.Total(), "partitions": perPartition}

	// Delete a topic; the list no longer has it.
	deleted, err := adm.DeleteTopic(ctx, doomed)
	if err == nil {
		err = deleted.Err
	}
	if err != nil {
		fail("delete topic", err)
	}
	// Deletion reaches every broker's metadata shortly after the answer (as in Kafka, where
	// brokers apply the controller's record asynchronously): list until it is gone, bounded.
	deletedAt := time.Now()
	after := listed(ctx, adm, prefix)
	for contains(after, doomed) && time.Since(deletedAt) < 10*time.Second {
		time.Sleep(100 * time.Millisecond)
		after = listed(ctx, adm, prefix)
	}
	out["afterDelete"] = after
	out["deleteVisibleMs"] = time.Since(deletedAt).Milliseconds()
	emit()
}
