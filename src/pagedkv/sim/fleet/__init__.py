"""A fleet of simulated replicas behind a router. ``replicas`` runs the replicas on one
global clock and routes each request from the KV events the replicas publish (through the
cluster's ``KVIndex``), or from every cache exactly; ``result`` holds the fleet's and each
replica's figures; ``sweep`` crosses routers and replica counts as independent jobs;
``plot`` draws that sweep; ``publish`` replays a trace through one simulated engine that
publishes its KV events over ZeroMQ, as a stand-in for a real engine."""
