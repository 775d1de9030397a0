"""Process plumbing: fork servers that keep heavy imports warm (fork_server.py), their client with the
slow-path fallback (fork_client.py), and the declaration of the two services the suite runs (services.py)."""
