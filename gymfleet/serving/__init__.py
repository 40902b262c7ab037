"""What every server is made of: the base server, resources/agent/model servers, sessions, bodies, Responses<->Chat
conversion, provenance, aggregate metrics."""
