"""Record formats: `records` turns Kafka messages into table rows and bad records into quarantine rows,
`arrow_json` is its fast path for JSON, `registry` reads Avro, Protobuf and JSON Schema through a Schema
Registry, `evolution` decides which table schema holds a newer writer schema, `values` holds the strict
coercions both JSON paths share. Runs in executors: no deltalake import. Imports: config, errors, c_libraries.
"""
