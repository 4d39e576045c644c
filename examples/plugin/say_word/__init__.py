"""SayWord: an agentgym environment plugin (the env lives in say_word.env, imported only by gym.make)."""
