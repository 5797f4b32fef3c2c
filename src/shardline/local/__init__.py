"""The local stack: the embedded AWS endpoint (moto_server) and what the pipelines need to exist on it."""
