"""The Apache Kafka backend (`kafka://HOST:PORT[,HOST:PORT]`), in parts, each with one job.

    backend.py      KafkaLog: the facade the rest of hilo-sync sees (the Log interface)
    connection.py   connecting clients; whether the cluster was ever reached
    admin.py        topics, their configs, consumer-group offsets, DeleteRecords
    writer.py       the producer: idle -> the run's transactional writer -> fenced; transactions
    reader.py       the reader supervisor: positions, reads, end offsets, replacing a wedged client
    errors.py       kafka-python's errors classified by type and `retriable`; one line each
    deadline.py     bounding kafka-python calls that wait without a bound
    causes.py       why a connection failed, from kafka-python's log lines

Nothing here is imported until a kafka:// log is opened (hilo.log.open_log).
"""
