import os

import dedupd

client = dedupd.Client(
    os.environ.get("DEDUPD_URL", "http://127.0.0.1:8080"), token=os.environ.get("DEDUPD_TOKEN")
)


@client.once(key=lambda event: f"sume:wh:{event['request_id']}", ttl=300, done_ttl=86400)
def handle(event: dict) -> dict:
    print("processing", event["request_id"])  # the work: runs once per request_id
    return {"charged": event["amount"]}


if __name__ == "__main__":
    event = {"request_id": "req_demo", "amount": 42}
    print(handle(event), handle(event))  # {'charged': 42} {'charged': 42}
