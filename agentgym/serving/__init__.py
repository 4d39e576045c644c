"""Network servers and clients: the OpenAI-compatible model server, the recording gateway, and envs served over
OpenEnv's protocol (server and remote client). Each module imports its web framework when it is used."""
