"""stub"""
PLANNERS: dict[str, str] = {}
