import os

import redis

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379"),
                         decode_responses=True)


def claim(request_id: str) -> bool:
    return bool(r.set(f"sume:wh:{request_id}", "processing", nx=True, ex=300))


def done(request_id: str) -> None:
    r.set(f"sume:wh:{request_id}", "done", ex=86400)


def release(request_id: str) -> None:
    r.delete(f"sume:wh:{request_id}")


if __name__ == "__main__":
    print(claim("req_demo"), claim("req_demo"))  # True False
    release("req_demo")
