"""Long-horizon quests: tasks that need 40+ turns and more context than a small model's window
(``agentgym/LongQuest-v0``)."""
