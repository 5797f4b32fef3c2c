"""The local stack: the embedded AWS endpoint (moto_server) and what the pipelines need to exist on it.

- :mod:`.embedded_aws`: moto_server on a free loopback port, reached by the real boto3 and pynamodb clients.
- :mod:`.moto_atomic`: that server with one request at a time, so conditional writes are atomic as on DynamoDB;
  a body cut short or failing its checksum is refused as S3 refuses it.
- :mod:`.moto_state`: the endpoint's state kept in a folder, so a restart or a kill -9 loses no answered write.
- :mod:`.tether`: a server the tests or ``make demo`` start ends with the process that started it, even one killed
  outright: Linux's parent-death signal ends its whole session.
- :mod:`.provision`: the tables and buckets the specs need, and the demo models in ``seed_models/`` where a spec
  pins their digest.
"""
