#!/bin/sh
# Kafka for docker-compose.yml with SASL/SCRAM-SHA-512 users and topic ACLs (docs/operations.md,
# "Security"). Clients use SASL_PLAINTEXT://kafka:9092; the broker's own traffic (inter-broker,
# controller) and this set-up use listeners bound to localhost inside this container only, whose
# unauthenticated principal is the super user. Passwords: /run/kafka/<user>.password, written by the
# compose service `credentials` (python -m recmesh.localsecrets).
set -eu
/etc/kafka/docker/run &
broker=$!
admin="--bootstrap-server localhost:9094"
bin=/opt/kafka/bin
until "$bin/kafka-broker-api-versions.sh" $admin >/dev/null 2>&1; do
  kill -0 "$broker" || exit 1
  sleep 1
done
for user in gateway feature ingest attribution cli; do
  "$bin/kafka-configs.sh" $admin --alter --entity-type users --entity-name "$user" \
    --add-config "SCRAM-SHA-512=[iterations=8192,password=$(cat "/run/kafka/$user.password")]"
done
allow() { user=$1; shift; "$bin/kafka-acls.sh" $admin --add --allow-principal "User:$user" "$@" >/dev/null; }
# The gateway may only produce behaviour events and its impressions.
allow gateway --operation Write --operation Describe --topic user_behavior
allow gateway --operation Write --operation Describe --topic impressions
# The ingest consumes behaviour events in its group and produces the dead letters.
allow ingest --operation Read --operation Describe --topic user_behavior
allow ingest --operation Read --group recmesh-feature-ingest
allow ingest --operation Write --operation Describe --topic user_behavior.dlq
# Attribution reads the impressions and the behaviour events in its own group.
allow attribution --operation Read --operation Describe --topic impressions
allow attribution --operation Read --operation Describe --topic user_behavior
allow attribution --operation Read --group recmesh-attribution
# The feature service writes its served-feature log.
allow feature --operation Write --operation Describe --topic served_features
# `recmesh init` creates the topics.
for topic in user_behavior user_behavior.dlq served_features impressions; do
  allow cli --operation Create --operation Describe --topic "$topic"
done
touch /tmp/sasl-ready
echo "SASL/SCRAM users and ACLs in place"
wait "$broker"
